"""``python -m infra.ops status|logs|cancel --stack NAME``: follow the stack's training job.

An operator CLI: it runs where `pulumi up` runs, not in the trainer image.

The job's id and the Batch endpoint come from the stack outputs (``pulumi stack output --json``,
or a file of them with ``--outputs-file``); the Batch calls use ``DefaultAzureCredential`` with
the data-plane roles the stack grants its job submitters.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from infra import batch
from infra.batch import TASK_ID, state_text, terminate_job
from trainer.cli import OneLineParser, fail

POLL_SECONDS = 5.0
REQUIRED_OUTPUTS = ("job_id", "batch_account_endpoint")


class JobsError(RuntimeError):
    """A one-line reason the command cannot go on."""


def read_outputs(stack: str, outputs_file: Path | None) -> dict[str, Any]:
    if outputs_file is not None:
        try:
            outputs = json.loads(outputs_file.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise JobsError(f"outputs_file={outputs_file}: cannot read JSON ({err})") from None
    else:
        if shutil.which("pulumi") is None:
            raise JobsError(
                "the pulumi CLI is not on PATH: install it, or pass --outputs-file with "
                "the output of `pulumi stack output --json`"
            )
        result = subprocess.run(
            ["pulumi", "stack", "output", "--json", "--stack", stack],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise JobsError(f"stack={stack}: `pulumi stack output` failed ({reason})")
        outputs = json.loads(result.stdout)
    missing = [key for key in REQUIRED_OUTPUTS if not outputs.get(key)]
    if missing:
        raise JobsError(
            f"stack={stack}: has no {missing[0]} output; is submitJob true and `pulumi up` done?"
        )
    return outputs


def status(client: Any, outputs: dict[str, Any], out: TextIO) -> int:
    job_id = outputs["job_id"]
    job = client.get_job(job_id)
    task = client.get_task(job_id, TASK_ID)
    info = task.execution_info
    lines = [
        f"job         {job_id}: {state_text(job.state)}",
        f"task        {TASK_ID}: {state_text(task.state)}",
    ]
    if info is not None:
        lines.append(
            f"            retries {info.retry_count}, exit code "
            f"{info.exit_code if info.exit_code is not None else '-'}"
        )
        if info.failure_info is not None:
            lines.append(f"            failure: {info.failure_info.message}")
    for label, key in (
        ("portal", "job_portal_url"),
        ("logs", "job_log_url"),
        ("checkpoints", "job_checkpoint_path"),
        ("image", "image_ref"),
    ):
        if outputs.get(key):
            lines.append(f"{label:<12}{outputs[key]}")
    out.write("\n".join(lines) + "\n")
    return 0


def logs(
    client: Any,
    outputs: dict[str, Any],
    out: TextIO,
    *,
    file_name: str = "stdout.txt",
    follow: bool = True,
    poll_seconds: float = POLL_SECONDS,
) -> int:
    """Print the primary task's file, then (``follow``) new bytes until the task completes."""
    from azure.core.exceptions import ResourceNotFoundError

    job_id = outputs["job_id"]
    offset = 0
    waiting_said = False
    while True:
        state = state_text(client.get_task(job_id, TASK_ID).state)
        try:
            size = client.get_task_file_properties(job_id, TASK_ID, file_name).content_length
        except ResourceNotFoundError:
            size = None
            if not waiting_said:
                out.write(f"waiting for task {TASK_ID} to start (state: {state})\n")
                waiting_said = True
        if size is not None and size > offset:
            chunks = client.download_task_file(
                job_id, TASK_ID, file_name, ocp_range=f"bytes={offset}-{size - 1}"
            )
            for chunk in chunks:
                out.write(chunk.decode("utf-8", errors="replace"))
            out.flush()
            offset = size
            continue
        if not follow or state == "completed":
            return 0
        time.sleep(poll_seconds)


def cancel(client: Any, outputs: dict[str, Any], out: TextIO) -> int:
    job_id = outputs["job_id"]
    terminate_job(client, job_id)
    out.write(
        f"job {job_id} terminated; its checkpoints stay in {outputs.get('job_checkpoint_path')}. "
        "Run `pulumi up --replace` on the job to start it again\n"
    )
    return 0


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m infra.ops", allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("status", "job and task state, retries, exit code, where logs and checkpoints are"),
        ("logs", "stream the primary task's stdout (like tail -f)"),
        ("cancel", "terminate the job (checkpoints are kept)"),
    ):
        sub = commands.add_parser(name, help=helptext)
        sub.add_argument("--stack", required=True, help="the stack whose job to follow")
        sub.add_argument("--outputs-file", type=Path, help="JSON of `pulumi stack output --json`")
        if name == "logs":
            sub.add_argument("--stderr", action="store_true", help="stream stderr.txt instead")
            sub.add_argument("--no-follow", action="store_true", help="print once and exit")
        sub.error = parser.error  # type: ignore[method-assign]
    return parser


def main(argv: list[str] | None = None, client_factory=batch.client) -> int:
    args = build_parser().parse_args(argv)
    from azure.core.exceptions import AzureError

    outputs: dict[str, Any] = {}
    try:
        outputs = read_outputs(args.stack, args.outputs_file)
        client = client_factory(outputs["batch_account_endpoint"])
        if args.command == "status":
            return status(client, outputs, sys.stdout)
        if args.command == "logs":
            name = "stderr.txt" if args.stderr else "stdout.txt"
            return logs(client, outputs, sys.stdout, file_name=name, follow=not args.no_follow)
        return cancel(client, outputs, sys.stdout)
    except JobsError as err:
        fail(str(err), 2)
    except AzureError as err:
        fail(f"job {outputs.get('job_id')}: {str(err).splitlines()[0]}", 1)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
