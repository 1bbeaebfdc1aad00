"""One acceptance run's state, shared by its steps (``run``) and its checks (``checks``): the
options and stack config, the Automation API stack, the data-plane clients, the clock, and what
the steps so far found (the stack's outputs, the Batch client, the job's stdout)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from dt_commands.acceptance.options import Options
from dt_commands.acceptance.profiles import Check
from infra.settings.stack import StackSettings
from trainer.common.errors import one_line

POLL_SECONDS = 30.0


@dataclass
class Result:
    check: Check
    status: str  # PASS, FAIL, SKIPPED, NOT RUN
    detail: str = ""


@dataclass
class Context:
    opts: Options
    values: dict[str, Any]
    settings: StackSettings  # values, validated
    stack: Any  # the Automation API stack
    batch_client: Callable[[str], Any]  # endpoint -> Batch client
    logs_container: Callable[[str], Any]  # account URL -> the logs container's client
    out: TextIO
    shell: Callable[[list[str]], subprocess.CompletedProcess[str]]  # az, git
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    targets: list[str] = field(default_factory=list)  # the Batch account and what it needs
    outputs: dict[str, Any] = field(default_factory=dict)
    client: Any = None  # the stack's Batch client, once its outputs are read
    stdout_text: str = ""  # the job's stdout, once uploaded
    busy_since: float | None = None  # when `pulumi up` had the pool and the job
    build_minutes: float = 0.0  # `pulumi up`'s minutes: the ACR build's upper bound

    def say(self, message: str) -> None:
        self.out.write(f"acceptance: {message}\n")
        self.out.flush()

    def pulumi_line(self, line: str) -> None:
        self.out.write(f"  | {line}\n")
        self.out.flush()


def error_line(err: BaseException) -> str:
    """The line of a (multi-line) error that says what went wrong. An Automation API
    ``CommandError`` is the CLI's whole result (`` code: ...``, `` stdout: ...``,
    `` stderr: ...``); the labels go."""
    lines = [
        re.sub(r"^(code|stdout|stderr):\s*", "", line.strip())
        for line in str(err).splitlines()
        if line.strip()
    ]
    for line in reversed(lines):
        if "error" in line.lower():
            return one_line(line)
    return one_line(lines[-1] if lines else type(err).__name__)


def batch_state(value: Any) -> str:
    from infra.batch import state_text

    return state_text(value)
