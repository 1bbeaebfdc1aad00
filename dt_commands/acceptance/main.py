"""``python -m dt_commands.acceptance``: its flags, and one run: the input checked offline, then
what this machine must have, then the look-ups, before anything is created."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from dt_commands.acceptance.context import error_line
from dt_commands.acceptance.errors import InputError, Unavailable
from dt_commands.acceptance.host import Host, prerequisites
from dt_commands.acceptance.options import Options, resolve_options, stack_values, validated
from dt_commands.acceptance.plan import describe, plan_targets
from dt_commands.acceptance.profiles import PROFILES
from dt_commands.acceptance.run import Acceptance, _batch_client, _logs_container, open_stack
from infra.settings.checks import ConfigError
from trainer.common.cli import OneLineParser
from trainer.common.errors import one_line


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m dt_commands.acceptance",
        description="Create a throwaway stack, run a small training job through it, check the "
        "outcome, check destroy stops a running job, destroy the stack.",
        allow_abbrev=False,
    )
    parser.add_argument("--profile", required=True, choices=sorted(PROFILES))
    parser.add_argument(
        "--dry-run", action="store_true", help="print what it would create and check; no Azure"
    )
    parser.add_argument("--location", default="eastus", help="Azure region (default eastus)")
    parser.add_argument("--vm-size", help="gpu profile: another InfiniBand GPU size")
    parser.add_argument(
        "--keep-on-failure",
        action="store_true",
        help="leave the stack in place when a check fails, to look at it",
    )
    parser.add_argument("--budget-email", help="who the budget alerts (default: your az login)")
    parser.add_argument("--client-ip", help="this machine's public IP (default: looked up)")
    parser.add_argument("--image-builder", choices=("acr", "docker"), default="acr")
    parser.add_argument(
        "--image-source-repo", help="https://.../<repo>.git for the acr builder (default: origin)"
    )
    parser.add_argument(
        "--image-source-token-env",
        metavar="VAR",
        help="environment variable holding a read token for a private repository",
    )
    parser.add_argument(
        "--image-ref",
        metavar="REF",
        help="run this image (<name>.azurecr.io/<repository>@sha256:<digest>) instead of "
        "building one; the nodes get AcrPull on its registry",
    )
    parser.add_argument(
        "--secrets-provider", help="for the new stack, e.g. azurekeyvault://<vault>/keys/<key>"
    )
    return parser


def main(
    argv: list[str] | None = None,
    *,
    host: Host | None = None,
    stack_factory: Callable[[str, str | None], Any] = open_stack,
    batch_client: Callable[[str], Any] = _batch_client,
    logs_container: Callable[[str], Any] = _logs_container,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    targets: Callable[[Options, dict[str, Any]], list[str]] = plan_targets,
) -> int:
    import os

    args = build_parser().parse_args(argv)
    host = host or Host(env=dict(os.environ))
    stream: TextIO = out or sys.stdout
    try:
        prepared = _prepare(args, host, stream, targets)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except InputError as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except Unavailable as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return 1
    if prepared is None:  # the dry run
        return 0
    opts, values, staged = prepared
    try:
        stack = stack_factory(opts.stack_name, opts.secrets_provider)
    except Exception as err:
        print(f"error: cannot create stack {opts.stack_name}: {error_line(err)}", file=sys.stderr)
        return 1
    runner = Acceptance(
        opts, values, stack, batch_client=batch_client, logs_container=logs_container,
        out=stream, run=host.run, sleep=sleep, clock=clock, targets=staged,
    )  # fmt: skip
    return runner.run()


def _prepare(
    args: argparse.Namespace,
    host: Host,
    out: TextIO,
    targets: Callable[[Options, dict[str, Any]], list[str]],
) -> tuple[Options, dict[str, Any], list[str]] | None:
    """The run's options, stack config and staged up's targets; None after a dry run.
    Input first (offline), then what this machine must have, then the look-ups."""
    opts = resolve_options(args, host, look_up=False)
    values = stack_values(opts)
    validated(opts, values)
    if args.dry_run:
        describe(opts, values, out)
        return None
    prerequisites(host, args.secrets_provider)
    opts = resolve_options(args, host, look_up=True)
    values = stack_values(opts)
    validated(opts, values)
    if opts.image_builder == "acr" and not opts.image_ref:
        host.check_source()
    return opts, values, targets(opts, values)


if __name__ == "__main__":
    sys.exit(main())
