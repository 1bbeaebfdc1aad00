"""What a training job outputs: its stack outputs' names (``JOB_OUTPUTS``, declared once), what
its resource answers on create, and what a refresh reads beside Batch's state: the last step and
rate rank 0 uploaded, and how old they are when storage cannot be read (a refresh never fails
on them)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pulumi

from infra.job_spec import JobSpec, live_folder_url
from trainer.common.errors import one_line

# A job's stack outputs, declared once: each name as the stack exports it (infra.stack) and
# the commands read it back (dt_commands.stack_outputs), and the TrainingJob output it carries
# (None: the job's node count, a setting rather than an output of the resource).
JOB_OUTPUTS: dict[str, str | None] = {
    "job_id": "job_id",
    "job_state": "state",
    "task_state": "task_state",
    "retries": "retries",
    "job_portal_url": "portal_url",
    "job_log_url": "log_url",
    "job_checkpoint_path": "checkpoint_path",
    "node_count": None,
    "metrics_url": "metrics_url",
    "outputs_url": "outputs_url",
    "step": "step",
    "images_per_sec": "images_per_sec",
    "tokens_per_sec": "tokens_per_sec",
    # When the step above was uploaded; a refresh that could not read it says why here.
    "progress_at": "progress_at",
    "progress_error": "progress_error",
    "pool_errors": "pool_errors",
    # The ranks the run named slower than the others in its latest window.
    "stragglers": "stragglers",
    # How the task's last failed try ended: the node whose rank failed it, and how to keep that
    # node out (infra.task_report).
    "last_try": "last_try",
}
# The resource's outputs: what the provider fills in and keeps.
OUTPUT_KEYS = tuple(key for key in JOB_OUTPUTS.values() if key is not None)
# A refresh reads the job's uploaded metrics for its current step; it waits this long per try
# for a storage account it cannot reach (not in storageAllowedIps from here), then goes on.
PROGRESS_TIMEOUT_SECONDS = 10.0
UNITS = ("images", "tokens")  # what a run's rate counts (infra.live_metrics.rate_key)


def job_outputs(spec: JobSpec, state: str) -> dict[str, str]:
    """What a job resource outputs beside its inputs, in ``state``: the provider's create and
    the offline plan's mocks (dt_commands.mocks) both answer with it."""
    return {
        "job_id": spec.job_id,
        "state": state,
        "portal_url": spec.portal_url,
        "log_url": spec.log_url,
        "metrics_url": spec.metrics_url,
        "outputs_url": spec.outputs_url,
        "checkpoint_path": spec.checkpoint_path,
    }


def metrics_folder_url(log_url: Any) -> str | None:
    return live_folder_url(log_url) if isinstance(log_url, str) and log_url else None


def hours_since(moment: Any) -> float | None:
    """Hours from ``moment`` (a datetime Batch reported) to now; None when Batch gave none."""
    if not isinstance(moment, datetime):
        return None
    return (utc_now() - moment).total_seconds() / 3600


def utc_now() -> datetime:
    return datetime.now(UTC)


def read_progress(job_id: str, metrics_url: str, recorded: dict[str, Any]) -> dict[str, Any]:
    """The job's last logged step and images/s, from what its rank 0 uploaded, and when that
    was uploaded (``progress_at``); nothing before the first upload. A refresh never fails on
    its metrics: when storage refuses, the recorded step stays, ``progress_error`` says why it
    is not current, and a warning gives its age."""
    from infra.live_metrics import (
        NotUploaded,
        StorageError,
        blob_container,
        latest_progress_and_stragglers,
    )
    from trainer.common.blob_folder import BlobFolder

    try:
        folder = BlobFolder.parse(metrics_url)
        container = blob_container(folder, timeout=PROGRESS_TIMEOUT_SECONDS)
        latest = latest_progress_and_stragglers(container, folder)
    except NotUploaded:
        return {"progress_error": None}
    except (StorageError, ValueError) as err:
        pulumi.log.warn(f"job {job_id}: no current step: {err}{_staleness(recorded)}")
        return {"progress_error": one_line(str(err))}
    if latest is None:
        return {"progress_error": None}
    (step, rate, unit, uploaded), stragglers = latest  # unit: images, or tokens for an LM's run
    return {
        "step": step,
        "stragglers": stragglers,
        **({} if rate is None else {f"{unit}_per_sec": round(rate, 1)}),
        "progress_at": None if uploaded is None else uploaded.astimezone(UTC).isoformat(),
        "progress_error": None,
    }


def _staleness(recorded: dict[str, Any]) -> str:
    """What the recorded step and rate are, and how old: '; step 40 and 120.0 images/s are as
    of <time> (3 h 5 min ago)'; nothing without a recorded step."""
    if recorded.get("step") is None:
        return ""
    rates = [f"{recorded[f'{u}_per_sec']} {u}/s" for u in UNITS if recorded.get(f"{u}_per_sec")]
    shown = " and ".join([f"step {recorded['step']}", *rates[:1]])
    verb = "are" if rates else "is"
    try:
        at = datetime.fromisoformat(str(recorded.get("progress_at")))
    except ValueError:
        return f"; {shown} {verb} from an earlier refresh (time unknown)"
    minutes = max(0, int((utc_now() - at).total_seconds() // 60))
    days, hours, minutes = minutes // 1440, minutes // 60 % 24, minutes % 60
    age = " ".join(f"{n} {u}" for n, u in ((days, "d"), (hours, "h"), (minutes, "min")) if n)
    return f"; {shown} {verb} as of {recorded['progress_at']} ({age or '0 min'} ago)"
