"""``dt-jobs status``: the job's and its task's state, retries and exit code, how its last failed
try ended (the node it names), why its pool gives it no nodes (``infra.pool_health``), the ranks
its run named slower than the others, and where its logs, checkpoints and results are."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any, TextIO

from dt_commands.jobs.call import Call
from infra.batch import TASK_ID, state_text
from infra.job_spec import WALL_CLOCK_EXPIRY, wall_clock_text
from infra.pool_health import pool_problems
from infra.settings.jobs import MAX_WALL_CLOCK_HOURS
from infra.task_report import last_try_line

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
    from trainer.common.azure_sdk import HttpResponseError

    pool_id = job.pool_info.pool_id if job.pool_info is not None else None
    if not pool_id:
        return []
    try:
        return pool_problems(client, pool_id, cancel_hint, job_id=job.id)
    except HttpResponseError as err:
        if err.status_code not in (401, 403):
            raise
        return [f"pool {pool_id}: not readable with this credential ({err.status_code})"]


def _ended_by_limit(job: Any) -> str:
    """Why a job Batch stopped at its wall-clock limit ended, and how to go on."""
    info = job.execution_info
    if info is None or getattr(info, "termination_reason", None) != WALL_CLOCK_EXPIRY:
        return ""
    return (
        f" (stopped by its wall-clock limit, {WALL_CLOCK_EXPIRY}: its checkpoints stay; to go "
        "on, raise jobs.<name>.maxWallClockHours and run `pulumi up --replace` on its job "
        "resource, which resumes from the newest checkpoint)"
    )


def status(
    client: Any, outputs: dict[str, Any], out: TextIO, cancel_hint: str = "cancel the job"
) -> int:
    job_id = outputs["job_id"]
    job = client.get_job(job_id)
    task = client.get_task(job_id, TASK_ID)
    info = task.execution_info
    lines = [
        f"job         {job_id}: {state_text(job.state)}{_ended_by_limit(job)}",
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
            # Read live; a retry that started since replaced the file, so the line the stack's
            # last refresh read (the job's last_try output) stands in for it.
            summary = last_try_line(client, job_id) or (
                f"{outputs['last_try']} (as of the last refresh)"
                if outputs.get("last_try")
                else None
            )
            lines += [f"last try    {summary}"] if summary else []
    if state_text(task.state) != "completed":
        lines += [f"pool        {line}" for line in pool_lines(client, job, cancel_hint)]
    # The stack's last refresh read them from the run's uploaded metrics (infra.job).
    when = f" (as of {outputs['progress_at']})" if outputs.get("progress_at") else ""
    lines += [f"straggler   {line}{when}" for line in outputs.get("stragglers") or []]
    limit = getattr(getattr(job, "constraints", None), "max_wall_clock_time", None)
    hours = limit.total_seconds() / 3600 if isinstance(limit, timedelta) else 0
    # Batch may report "no limit" as the largest duration it holds: past any we set, none.
    hours = hours if hours <= MAX_WALL_CLOCK_HOURS else 0
    lines.append(f"limit       {wall_clock_text(hours)}")
    lines += [f"{label:<12}{outputs[key]}" for label, key in WHERE if outputs.get(key)]
    out.write("\n".join(lines) + "\n")
    return 0
