"""``dt-jobs`` on a stack of the AzureML backend: ``list``, ``status`` and ``cancel`` ask ARM for
the jobs' live state (Jobs - Get, Jobs - Cancel: infra.azureml_job_guard), with the operator's
own credential; ``logs`` reads the node logs the launchers copy to the job's Blob folder;
``metrics``, ``tensorboard`` and ``fetch`` read Blob as on Batch (their commands run as they
are); ``keep-out`` is Batch's and says in one line where to look instead."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dt_commands.jobs.call import Call
from dt_commands.jobs.table import table
from dt_commands.stack_outputs import Job, JobsError, require, stack_jobs
from infra.azureml_job_guard import ENDED, JobGuardError, job_arm_id, job_state, request_cancel
from infra.live_metrics import blob_container, storage_errors
from trainer.common.blob_folder import BlobFolder
from trainer.launch.log_upload import FOLDER as NODE_LOGS

POLL_SECONDS = 10.0  # between reads of the node logs while `logs` follows a job
# What each job's live state says beside the outputs (labels as `dt-jobs status` on Batch).
WHERE = (
    ("studio", "job_studio_url"),
    ("logs", "job_log_url"),
    ("checkpoints", "checkpoint_mirror_url"),
    ("metrics", "metrics_url"),
    ("results", "outputs_url"),
    ("image", "image_ref"),
)


class AzureRefused(JobsError):
    """ARM refused or failed the call: the environment's fault (exit 1)."""

    code = 1


def on_azureml(outputs: dict[str, Any]) -> bool:
    """Whether the stack runs its jobs on AzureML (its outputs name the compute)."""
    return bool(outputs.get("azureml_compute_name"))


def _arm_id(call: Call, job: Job) -> str:
    return job_arm_id(require(call.outputs, "azureml_workspace_id", call.stack), job.job_id)


def _state(call: Call, job: Job) -> str:
    try:
        return job_state(_arm_id(call, job)) or "not found"
    except JobGuardError as err:
        raise AzureRefused(str(err)) from None


def list_jobs(call: Call) -> int:
    rows = [("NAME", "JOB ID", "STATE", "NODES", "STUDIO")]
    for job in stack_jobs(call.outputs, call.stack):
        nodes = str(job.outputs.get("node_count") or "-")
        studio = str(job.outputs.get("job_studio_url") or "-")
        rows.append((job.name, job.job_id, _state(call, job), nodes, studio))
    call.out.write(table(rows, right={3}))
    return 0


def status(call: Call) -> int:
    job = call.job()
    state = _state(call, job)
    lines = [f"job         {job.job_id}: {state} (AzureML)"]
    if state not in (*ENDED, "not found"):
        lines.append(f"            cancel: dt-jobs cancel --stack {call.stack} --job {job.name}")
    merged = {**call.outputs, **job.outputs}
    lines += [f"{label:<12}{merged[key]}" for label, key in WHERE if merged.get(key)]
    call.out.write("\n".join(lines) + "\n")
    return 0


def cancel(call: Call) -> int:
    job = call.job()
    try:
        state = request_cancel(_arm_id(call, job))
    except JobGuardError as err:
        raise AzureRefused(str(err)) from None
    mirror = job.outputs.get("checkpoint_mirror_url")
    if state is None:
        call.out.write(f"job {job.job_id}: not found in the workspace; nothing to cancel\n")
    elif state in ENDED:
        call.out.write(f"job {job.job_id} had already ended ({state}); nothing to cancel\n")
    else:
        call.out.write(
            f"job {job.job_id}: cancel requested (it was {state}); its trainer checkpoints on "
            f"the way out, and its checkpoints stay in {mirror}. `pulumi up --replace` on the "
            "job starts it again from there\n"
        )
    return 0


def logs(call: Call) -> int:
    """Every node's launch log, as the launchers copy it to the job's log folder
    (trainer.launch.log_upload); followed until the job ends unless --no-follow."""
    job = call.job()
    if call.args.stderr:
        raise JobsError("--stderr: an AzureML job's node log holds both streams; drop --stderr")
    url = str(require(job.outputs, "job_log_url", call.stack))
    folder = BlobFolder.parse(url)
    container = blob_container(folder)
    prefix = folder.blob(NODE_LOGS)
    sent: dict[str, int] = {}
    shown = ""
    while True:
        ended = call.args.no_follow or _state(call, job) in (*ENDED, "not found")
        with storage_errors(f"{url}{NODE_LOGS}"):
            for blob in sorted(container.list_blobs(name_starts_with=prefix), key=_name):
                if blob.size <= sent.get(blob.name, 0):
                    continue
                offset = sent.get(blob.name, 0)
                data = container.download_blob(blob.name, offset=offset).readall()
                sent[blob.name] = offset + len(data)
                if blob.name != shown:
                    node = blob.name[len(prefix) :].removesuffix(".log")
                    call.out.write(f"===== node {node} =====\n")
                    shown = blob.name
                call.out.write(data.decode("utf-8", errors="replace"))
        call.out.flush()
        if ended:
            break
        time.sleep(POLL_SECONDS)
    if not sent:
        call.out.write(f"job {job.job_id}: no node has copied its log to {url}{NODE_LOGS} yet\n")
    return 0


def _name(blob: Any) -> str:
    return str(blob.name)


def _batch_only(what: str, instead: str) -> Callable[[Call], int]:
    def refuse(call: Call) -> int:
        job = call.job()
        raise JobsError(
            f"stack={call.stack}: {what} on the AzureML backend; {instead}".format(
                studio=job.outputs.get("job_studio_url") or call.outputs.get("azureml_studio_url"),
                job_id=job.job_id,
            )
        )

    return refuse


# The commands that run otherwise on an AzureML stack; the others (metrics, tensorboard, fetch)
# read Blob and run as they are.
COMMANDS: dict[str, Callable[[Call], int]] = {
    "list": list_jobs,
    "status": status,
    "cancel": cancel,
    "logs": logs,
    "keep-out": _batch_only(
        "dt-jobs keep-out keeps a Batch pool's node out, which a job does not have",
        "AzureML replaces a compute cluster's failed node itself; see the job's studio page "
        "({studio})",
    ),
}
