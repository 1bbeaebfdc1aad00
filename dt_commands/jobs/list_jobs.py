"""``dt-jobs list``: one row per job of the stack: Batch's live state, and the step and rate its
rank 0 uploaded last (or, when they cannot be read, those the stack's last refresh recorded)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TextIO

from dt_commands.jobs.call import Call
from dt_commands.jobs.table import table
from dt_commands.stack_outputs import stack_jobs
from infra.batch import TASK_ID, state_text
from infra.live_metrics import NotUploaded, StorageError, blob_container, latest_step
from trainer.common.blob_folder import BlobFolder

NAME = "list"
HELP = "every job of the stack: state, nodes, retries, current step, throughput"
ONE_JOB = False  # no --job: it lists them all


def add_arguments(sub: argparse.ArgumentParser) -> None:
    del sub  # --stack and --outputs-file only


def run(call: Call) -> int:
    return list_jobs(call.client(), call.outputs, call.stack, call.out, call.err)


def list_jobs(
    client: Any,
    outputs: dict[str, Any],
    stack: str,
    out: TextIO,
    err: TextIO,
    *,
    container_for: Callable[[BlobFolder], Any] = blob_container,
) -> int:
    """One row per job: Batch's live state, and the step and rate rank 0 uploaded last."""
    from trainer.common.azure_sdk import ResourceNotFoundError

    rows = [("NAME", "JOB ID", "JOB", "TASK", "NODES", "RETRIES", "STEP", "THROUGHPUT")]
    notes = []
    for job in stack_jobs(outputs, stack):
        task_state, retries, nodes = "-", "-", job.outputs.get("node_count")
        try:
            job_state = state_text(client.get_job(job.job_id).state)
        except ResourceNotFoundError:
            job_state = "not found"
        if job_state != "not found":
            try:
                task = client.get_task(job.job_id, TASK_ID)
            except ResourceNotFoundError:
                task = None
            if task is not None:
                task_state = state_text(task.state)
                if task.execution_info is not None:
                    retries = str(task.execution_info.retry_count)
                if nodes is None and task.multi_instance_settings is not None:
                    nodes = task.multi_instance_settings.number_of_instances
        step, rate = "-", "-"
        if job.metrics is not None:
            try:
                latest = latest_step(container_for(job.metrics), job.metrics)
                if latest is not None:
                    step = str(latest[0])
                    rate = "-" if latest[1] is None else f"{latest[1]:.1f} {latest[2]}/s"
            except NotUploaded:
                pass
            except StorageError as error:
                notes.append(f"job {job.name}: metrics: {error}")
                step, rate = _recorded_progress(job.outputs)
        row = (job.name, job.job_id, job_state, task_state, str(nodes or "-"), retries, step, rate)
        rows.append(row)
    out.write(table(rows, right={4, 5, 6, 7}))
    for note in notes:
        err.write(f"note: {note}\n")
    return 0


def _recorded_progress(outputs: dict[str, Any]) -> tuple[str, str]:
    """The step and rate the stack's last refresh recorded, marked with when they were
    uploaded (``progress_at``); ("-", "-") without them."""
    step, at = outputs.get("step"), outputs.get("progress_at")
    if step is None or not at:
        return "-", "-"
    unit = next((u for u in ("images", "tokens") if outputs.get(f"{u}_per_sec")), None)
    rate = "-" if unit is None else f"{outputs[f'{unit}_per_sec']:.1f} {unit}/s"
    return f"{step} (as of {at})", rate
