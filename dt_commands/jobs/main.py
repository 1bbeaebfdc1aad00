"""``dt-jobs list|status|logs|cancel|keep-out|metrics|tensorboard|fetch|trials|sweep``: the parser,
and one run of a command, every fault a one-line error (exit 2 for the command or the stack, 1
for Azure)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dt_commands.jobs import (
    azureml_jobs,
    cancel,
    fetch,
    keep_out,
    list_jobs,
    logs,
    metrics,
    status,
    sweep,
    tensorboard,
    trials,
)
from dt_commands.jobs.call import Call
from dt_commands.jobs.tensorboard import start_tensorboard
from dt_commands.stack_outputs import JobsError, OutputsError, read_outputs
from infra import batch
from infra.live_metrics import StorageError
from trainer.common.cli import OneLineParser, fail

# In the order --help lists them; sweep (its own options) comes last.
COMMANDS = (list_jobs, status, logs, cancel, keep_out, metrics, tensorboard, fetch, trials)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="dt-jobs", allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        sub = commands.add_parser(command.NAME, help=command.HELP)
        sub.add_argument("--stack", required=True, help="the stack whose jobs to follow")
        sub.add_argument("--outputs-file", type=Path, help="JSON of `pulumi stack output --json`")
        if getattr(command, "ONE_JOB", True):
            sub.add_argument("--job", help="which job of the stack's jobs (needed if several)")
        command.add_arguments(sub)
        sub.error = parser.error  # type: ignore[method-assign]
    sweep.add_parser(commands).error = parser.error  # type: ignore[method-assign]
    return parser


def main(
    argv: list[str] | None = None,
    client_factory: Callable[[str], Any] = batch.client,
    start: Callable[[list[str]], Any] = start_tensorboard,
) -> int:
    parser = build_parser()
    # Only a sweep takes more arguments: the trainer flags of its --local runs.
    args, extra = parser.parse_known_args(argv)
    if args.command == "sweep":
        return sweep.run(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from trainer.common.azure_sdk import AzureError

    runs: dict[str, Callable[[Call], int]] = {command.NAME: command.run for command in COMMANDS}
    run = runs[args.command]
    call = None
    try:
        outputs = read_outputs(args.stack, args.outputs_file)
        call = Call(args, outputs, client_factory, start, sys.stdout, sys.stderr)
        if azureml_jobs.on_azureml(outputs):
            run = azureml_jobs.COMMANDS.get(args.command, run)
        return run(call)
    except JobsError as err:
        fail(_outputs_message(err, args), err.code)
    except StorageError as err:
        fail(str(err), err.code)
    except AzureError as err:
        where = call.where if call is not None else f"stack={args.stack}"
        fail(f"{where}: {str(err).splitlines()[0]}", 1)
    except KeyboardInterrupt:
        return 130


def _outputs_message(err: JobsError, args: argparse.Namespace) -> str:
    """The error's line; when the outputs came from a file, naming the file with what is wrong."""
    message, where = str(err), f"outputs_file={args.outputs_file}"
    if isinstance(err, OutputsError) and args.outputs_file and not message.startswith(where):
        return f"{where}: {message.removeprefix(f'stack={args.stack}: ')}"
    return message


if __name__ == "__main__":
    sys.exit(main())
