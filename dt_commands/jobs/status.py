"""``dt-jobs status``: the job's and its task's state, retries and exit code, how its last failed
try ended (the node it names), why its pool gives it no nodes (``infra.pool_health``), the ranks
its run named slower than the others, and where its logs, checkpoints and results are."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from dt_commands.jobs.call import Call
from infra.batch import TASK_ID, state_text
from infra.pool_health import pool_problems

NAME = "status"
HELP = "job and task state, retries, exit code, where logs and checkpoints are"
# The outputs it points to, by label.
WHERE = (
    ("portal", "job_portal_url"),
    ("logs", "job_log_url"),
    ("checkpoints", "job_checkpoint_path"),
    ("metrics", "metrics_url"),
    ("results", "outputs_url"),
    ("image", "image_ref"),
)


def add_arguments(sub: argparse.ArgumentParser) -> None:
    del sub  # --stack, --outputs-file and --job only


def run(call: Call) -> int:
    job = call.job()
    hint = f"cancel the job (dt-jobs cancel --stack {call.stack} --job {job.name})"
    return status(call.client(), job.outputs, call.out, hint)


def pool_lines(client: Any, job: Any, cancel_hint: str) -> list[str]:
    """Why the job's pool gives it no nodes (infra.pool_health); a credential that may not read
    the pool gets one line saying so instead."""
    from azure.core.exceptions import HttpResponseError

    pool_id = job.pool_info.pool_id if job.pool_info is not None else None
    if not pool_id:
        return []
    try:
        return pool_problems(client, pool_id, cancel_hint, job_id=job.id)
    except HttpResponseError as err:
        if err.status_code not in (401, 403):
            raise
        return [f"pool {pool_id}: not readable with this credential ({err.status_code})"]


# The primary's report ends each try's output with one line (trainer.launch.records, which
# dt_commands may not import; tests/trainer/launch/test_launch_env.py holds the two together): a
# failed try's names the node whose worker failed, by address and Batch node id.
REPORT_MARK = "===== attempt "
TAIL_BYTES = 16384


def last_try_line(client: Any, job_id: str) -> str | None:
    """The report's line of the task's last finished try, from the primary's stdout.txt (read
    through the Batch file API, as `dt-jobs logs` reads it); None when there is none to read
    (no try ended yet, a retry started a new file, or the file is not readable)."""
    from azure.core.exceptions import AzureError

    try:
        size = int(client.get_task_file_properties(job_id, TASK_ID, "stdout.txt").content_length)
        first = max(0, size - TAIL_BYTES)
        span = f"bytes={first}-{size - 1}" if size else None
        data = b"".join(client.download_task_file(job_id, TASK_ID, "stdout.txt", ocp_range=span))
    except (AzureError, OSError, ValueError, TypeError):
        return None
    lines = data.decode("utf-8", "replace").splitlines()
    return next(
        (line[len("===== ") :] for line in reversed(lines) if line.startswith(REPORT_MARK)), None
    )


def status(
    client: Any, outputs: dict[str, Any], out: TextIO, cancel_hint: str = "cancel the job"
) -> int:
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
        if info.retry_count or info.exit_code:
            summary = last_try_line(client, job_id)
            lines += [f"last try    {summary}"] if summary else []
    if state_text(task.state) != "completed":
        lines += [f"pool        {line}" for line in pool_lines(client, job, cancel_hint)]
    # The stack's last refresh read them from the run's uploaded metrics (infra.job).
    when = f" (as of {outputs['progress_at']})" if outputs.get("progress_at") else ""
    lines += [f"straggler   {line}{when}" for line in outputs.get("stragglers") or []]
    lines += [f"{label:<12}{outputs[key]}" for label, key in WHERE if outputs.get(key)]
    out.write("\n".join(lines) + "\n")
    return 0
