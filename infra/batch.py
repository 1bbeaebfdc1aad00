"""The Batch data-plane contract the job resource (infra/job.py) and the operator CLI
(infra/ops.py) share: the task's id, how Batch spells states, the one client factory, and the
calls azure-batch 15.1 gets wrong.

Azure SDK imports stay inside functions: the job resource's provider host imports this module
for every operation, and Pulumi pickles the provider by reference.
"""

from __future__ import annotations

import functools
from typing import Any

TASK_ID = "train"  # the multi-instance task in every job
# Batch's own default reason; also what makes the terminate request sendable (terminate_options).
TERMINATE_REASON = "UserTerminate"


def endpoint_url(endpoint: str) -> str:
    """The one endpoint convention: ``https://<account>.<region>.batch.azure.com``, from the
    account's endpoint as ARM reports it (no scheme) or a URL already."""
    return endpoint if endpoint.startswith("https://") else f"https://{endpoint}"


@functools.cache
def credential() -> Any:
    """One credential per process: each new ``DefaultAzureCredential`` probes its whole chain
    again, and the provider host serves every operation of a deployment."""
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential()


@functools.cache
def client(endpoint: str) -> Any:
    """One client per Batch account, so its pipeline reuses the token it acquired."""
    from azure.batch import BatchClient

    return BatchClient(endpoint=endpoint_url(endpoint), credential=credential())


def state_text(value: Any) -> str:
    """A Batch state as Batch spells it (``active``), from the SDK's enum or a plain string."""
    return str(getattr(value, "value", value))


def terminate_options() -> Any:
    """The options ``begin_terminate_job`` must get.

    azure-batch 15.1.0 sends a terminate request's ``Content-Type`` header only when it has a
    body, and serializing the missing header raises ``ValueError: No value for given attribute``
    before anything is sent: ``begin_terminate_job(job_id)`` always fails (the same bug as
    Azure/azure-sdk-for-python #46815 on ``begin_reboot_node``). An empty options object is
    falsy and fails the same way, so give the reason explicitly.
    """
    from azure.batch.models._models import BatchJobTerminateOptions

    return BatchJobTerminateOptions(termination_reason=TERMINATE_REASON)


def poll_succeeded(poller: Any, timeout: float | None = None) -> bool:
    """Wait for an azure-batch poller (at most ``timeout`` seconds). False when its polling
    failed: the SDK's job pollers catch any ``AzureError`` while reading the job, set the
    status to ``Failed`` and let ``result()`` return as if all went well
    (azure/batch/_operations/_polling.py)."""
    poller.result(timeout)
    return poller.status() != "Failed"


def terminate_job(batch: Any, job_id: str) -> None:
    """Terminate the job and wait until it is no longer terminating; raises what Batch said."""
    if not poll_succeeded(batch.begin_terminate_job(job_id, terminate_options())):
        batch.get_job(job_id)  # the poller swallowed an error: read once more to raise it
