"""A stack's outputs and its training jobs, read and checked once for the commands around the
program: ``ops`` (the jobs CLI), ``fetch``, ``plan --deployed`` and ``sweep``.

The outputs come from ``pulumi stack output --json`` or a file of them; the jobs are the
``jobs`` map (name -> that job's outputs) or a stack's single job at the top level. Every fault
is a one-line ``JobsError`` naming the stack or the file."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.job_outputs import JOB_OUTPUTS
from infra.job_spec import live_folder_url
from infra.settings.jobs import SHORTHAND_JOB
from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import one_line


class JobsError(RuntimeError):
    """A one-line reason the command cannot go on (exit code 2: fix the command or the stack)."""

    code = 2

    def __init__(self, message: str) -> None:
        # One line even when it quotes the outputs (a job name may hold a newline).
        super().__init__(one_line(message))


class OutputsError(JobsError):
    """The stack's outputs lack something or have the wrong shape; from ``--outputs-file`` the
    message names the file."""


def json_type(value: Any) -> str:
    """``value``'s type in JSON's words (for errors about a file's shape)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__
    )


def pulumi_stack(command: list[str], stack: str, file_option: str) -> str:
    """What ``pulumi stack <command> --stack <stack>`` prints; a one-line JobsError when the CLI
    is missing (naming ``file_option``, which takes the same output from a file) or fails."""
    shown = " ".join(["pulumi", "stack", *command])
    if shutil.which("pulumi") is None:
        raise JobsError(
            f"the pulumi CLI is not on PATH: install it, or pass {file_option} with the output "
            f"of `{shown}`"
        )
    result = subprocess.run(
        ["pulumi", "stack", *command, "--stack", stack],
        capture_output=True,
        text=True,
        errors="replace",
    )
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise JobsError(f"stack={stack}: `pulumi stack {command[0]}` failed ({reason})")
    return result.stdout


def read_outputs(
    stack: str, outputs_file: Path | None, label: str = "outputs_file"
) -> dict[str, Any]:
    """The stack's outputs: ``outputs_file`` (``label`` names its option in errors) or, without
    one, ``pulumi stack output --json``. Anything but a JSON object is a one-line JobsError."""
    if outputs_file is not None:
        where = f"{label}={outputs_file}"
        try:
            data = outputs_file.read_bytes()
        except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
            reason = getattr(err, "strerror", None) or err
            raise JobsError(f"{where}: cannot read it ({reason})") from None
        try:
            # bytes: json detects UTF-8, UTF-16 and UTF-32 itself; anything else is refused.
            outputs = json.loads(data)
        except UnicodeDecodeError as err:
            raise JobsError(
                f"{where}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                f"{err.start}); give the output of `pulumi stack output --json` as it printed it"
            ) from None
        except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
            reason = "nested too deeply" if isinstance(err, RecursionError) else err
            raise JobsError(
                f"{where}: not JSON ({reason}); give the output of `pulumi stack output --json`"
            ) from None
    else:
        where = f"stack={stack}"
        printed = pulumi_stack(["output", "--json"], stack, "--outputs-file")
        try:
            outputs = json.loads(printed)
        except (ValueError, RecursionError):
            raise JobsError(
                f"stack={stack}: `pulumi stack output --json` printed no JSON"
            ) from None
    if not isinstance(outputs, dict):
        raise OutputsError(
            f"{where}: the outputs must be a JSON object (of `pulumi stack output --json`), "
            f"got {json_type(outputs)}"
        )
    return outputs


def require(outputs: dict[str, Any], key: str, stack: str) -> str:
    value = outputs.get(key)
    if not value or not isinstance(value, str):
        raise OutputsError(f"stack={stack}: has no {key} output; is `pulumi up` done?")
    return value


@dataclass(frozen=True)
class Job:
    """One job of a stack: its name and the stack's outputs with the job's own over them."""

    name: str
    outputs: dict[str, Any]
    metrics: BlobFolder | None  # where its rank 0 uploads metrics; None: the stack names none

    @property
    def job_id(self) -> str:
        return self.outputs["job_id"]


def _job(stack: str, name: str, shared: dict[str, Any], own: Any, where: str) -> Job:
    """One job from its outputs ``own`` (``where``: "jobs.<name>", or "" at the top level)."""

    def key(name: str) -> str:
        return f"{where}.{name}" if where else name

    if not isinstance(own, dict):
        raise OutputsError(
            f"stack={stack}: output {where or 'job'} must be an object, got {json_type(own)}"
        )
    if not own.get("job_id") or not isinstance(own["job_id"], str):
        raise OutputsError(
            f"stack={stack}: output {where or 'job_id'} has no job_id (a string); is `pulumi up` "
            "done?"
        )
    node_count = own.get("node_count")
    if node_count is not None and (isinstance(node_count, bool) or not isinstance(node_count, int)):
        raise OutputsError(
            f"stack={stack}: output {key('node_count')}={node_count!r}: must be an integer"
        )
    url, url_key = own.get("metrics_url"), key("metrics_url")
    if url is None and isinstance(own.get("job_log_url"), str):
        # A stack deployed before metrics_url existed: the trainer's live folder in its logs.
        url, url_key = (
            live_folder_url(own["job_log_url"]),
            key("job_log_url") + " + live/",
        )
    folder = None
    if url is not None:
        try:
            folder = BlobFolder.parse(url)
        except ValueError as err:
            raise OutputsError(f"stack={stack}: output {url_key}={url!r}: {err}") from None
    outputs = {**shared, **own, **({"metrics_url": folder.url} if folder else {})}
    return Job(name, outputs, folder)


def stack_jobs(outputs: dict[str, Any], stack: str) -> list[Job]:
    """Every job of the stack, by name: the ``jobs`` map, or the single job's top-level outputs."""
    # A job's outputs (infra.job_outputs.JOB_OUTPUTS: its state and retries as of the last refresh;
    # ``list`` asks Batch for the live ones); a single job's job_* repeat at the top level.
    shared = {k: v for k, v in outputs.items() if k not in (*JOB_OUTPUTS, "jobs")}
    if "jobs" not in outputs:
        if not outputs.get("job_id"):
            raise OutputsError(
                f"stack={stack}: has no job_id output (nor jobs); are jobs declared (or "
                "submitJob true) and `pulumi up` done?"
            )
        own = {k: outputs[k] for k in JOB_OUTPUTS if k in outputs}
        return [_job(stack, SHORTHAND_JOB, shared, own, "")]
    jobs = outputs["jobs"]
    if not isinstance(jobs, dict):
        raise OutputsError(
            f"stack={stack}: output jobs must map job names to objects, got {json_type(jobs)}"
        )
    if not jobs:
        raise OutputsError(f"stack={stack}: has no jobs (its jobs output is empty)")
    return [_job(stack, str(name), shared, jobs[name], f"jobs.{name}") for name in sorted(jobs)]


def select_job(outputs: dict[str, Any], stack: str, name: str | None) -> Job:
    """The job ``--job NAME`` names; without it, the stack's only job."""
    jobs = stack_jobs(outputs, stack)
    names = ", ".join(job.name for job in jobs)
    if name is None:
        if len(jobs) > 1:
            raise JobsError(f"stack={stack}: has {len(jobs)} jobs ({names}); pass --job NAME")
        return jobs[0]
    for job in jobs:
        if job.name == name:
            return job
    raise JobsError(f"job={name}: stack {stack} has no such job; its jobs: {names}")
