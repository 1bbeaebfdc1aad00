"""What a native AzureML job cannot say of itself: a running job is not replaced unless the
stack allows it (protectRunningJobs, replaceJobs), and a job that is replaced or removed is
cancelled first, so that its nodes are free for the next one and it checkpoints on its way out.
The guard names the job it watches (its ARM id, which any change of the job renews:
infra.azureml_command.AzuremlJobSpec); the job resource depends on it, so Pulumi runs the
guard's check and cancel before it creates the job's replacement, and ``pulumi preview`` shows
the refusal. The job resource itself is retained on delete: AzureML keeps a job's run record
(its metrics, logs and lineage), and `az ml job` has no delete, only archive (read 2026-11-29,
learn.microsoft.com/cli/azure/ml/job).

Jobs - Get and Jobs - Cancel over ARM (REST Job/get.json, Job/cancel.json: a 202, then the job's
status moves to CancelRequested and Canceled), with the deployer's own credential."""

from __future__ import annotations

import time
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, UpdateResult

from infra import registry
from infra.dynamic import OneLineError, Provider
from trainer.common.errors import first_line

# The version azure-native sends machinelearningservices:Job at (tests hold them equal).
JOBS_API_VERSION = "2025-12-01"
# The states a job ends in (JobStatus in @azure/arm-machinelearning, terminal ones as
# azure-ai-ml's _run_history_constants.py lists them); any other may still hold nodes.
ENDED = ("Completed", "Failed", "Canceled")
CANCEL_WAIT_SECONDS = 900.0  # the trainer checkpoints on SIGTERM; AzureML then stops it
POLL_SECONDS = 10.0


class JobGuardError(OneLineError):
    """A refusal or a failure of the guard, one line naming the job and the fix."""


def job_arm_id(workspace_id: str, job_name: str) -> str:
    return f"{workspace_id.rstrip('/')}/jobs/{job_name}"


def _send(method: str, path: str) -> Any:
    """ARM's answer; JobGuardError when it cannot be reached (a network, a credential)."""
    from infra.azure_sdk import HttpRequest
    from trainer.common.azure_sdk import AzureError

    url = f"{registry.ARM_ENDPOINT.rstrip('/')}{path}"
    request = HttpRequest(method, url, params={"api-version": JOBS_API_VERSION})
    try:
        return registry.arm_client().send_request(request)
    except AzureError as err:
        raise JobGuardError(
            f"could not reach ARM for AzureML job {_name(path.removesuffix('/cancel'))} "
            f"({type(err).__name__}: {first_line(err)}); check the network and `az login`, "
            "then try again"
        ) from None


def _refused(answer: Any, doing: str, job: str) -> JobGuardError:
    try:
        error = answer.json().get("error") or {}
    except ValueError:
        error = {}
    said = error.get("message") or answer.reason or ""
    fix = (
        "this credential needs a role on the workspace that reads and cancels its jobs (Owner, "
        "Contributor, or AzureML Data Scientist as the team's has), then try again"
        if answer.status_code in (401, 403)
        else "try again; if it persists, see the job in the studio"
    )
    status = answer.status_code
    return JobGuardError(f"could not {doing} AzureML job {job} ({status}: {said}); {fix}")


def job_state(arm_id: str) -> str | None:
    """The job's status as AzureML reports it now; None when there is no such job."""
    answer = _send("GET", arm_id)
    if answer.status_code == 404:
        return None
    if answer.status_code != 200:
        raise _refused(answer, "read", _name(arm_id))
    return str((answer.json().get("properties") or {}).get("status") or "Unknown")


def request_cancel(arm_id: str) -> str | None:
    """Cancel the job unless it has ended; its state before (None: no such job)."""
    state = job_state(arm_id)
    if state is None or state in ENDED:
        return state
    answer = _send("POST", f"{arm_id}/cancel")
    if answer.status_code not in (200, 202, 204):
        raise _refused(answer, "cancel", _name(arm_id))
    return state


def cancel_and_wait(arm_id: str) -> str | None:
    """Cancel the job unless it has ended, and wait until it has; its last state (None: gone)."""
    state = request_cancel(arm_id)
    if state is None or state in ENDED:
        return state
    pulumi.log.info(f"AzureML job {_name(arm_id)} was {state}: cancelled, waiting for it to end")
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    while state is not None and state not in ENDED:
        if time.monotonic() >= deadline:
            raise JobGuardError(
                f"AzureML job {_name(arm_id)} is still {state} {CANCEL_WAIT_SECONDS:.0f} s after "
                "its cancel; wait for it to end (dt-jobs status), then run pulumi up again"
            )
        time.sleep(POLL_SECONDS)
        state = job_state(arm_id)
    return state


def _name(arm_id: str) -> str:
    return arm_id.rstrip("/").rsplit("/", 1)[-1]


def refusal(label: str, old: str, state: str) -> str:
    return (
        f"job {label} ({_name(old)}) is {state} on AzureML, and this change would replace it "
        "(an AzureML job never changes: any change, a new image too, is a new job): let it "
        f"finish, cancel it (dt-jobs cancel --stack <stack> --job {label}), or add {label} to "
        "replaceJobs; a replacement with the same training settings resumes from its newest "
        "checkpoint"
    )


class AzuremlJobGuardProvider(Provider):
    """Inputs: ``job`` (the job's ARM id), ``label`` (its name in the stack's jobs),
    ``protect_running`` (this deployment's permission: never compared)."""

    # Renaming or moving this class breaks refresh and destroy of existing stacks: the SDK
    # pickles it by reference into their state.

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(props["job"], dict(props))

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        old, new = olds.get("job"), news.get("job")
        if old == new and olds.get("label") == news.get("label"):
            return DiffResult(changes=False)
        # A job a preview does not know yet (a new image being built) is a new job too.
        if old and old != new and news.get("protect_running"):
            state = job_state(old)
            if state is not None and state not in ENDED:
                raise JobGuardError(refusal(str(news.get("label")), old, state))
        return DiffResult(changes=True, replaces=[])

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """The job is about to be replaced (its resource depends on this): its nodes freed,
        its last checkpoint written."""
        if olds.get("job") and olds.get("job") != news.get("job"):
            cancel_and_wait(str(olds["job"]))
        return UpdateResult(dict(news))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        """The job left the stack (or the stack is destroyed): it stops, its record stays."""
        if props.get("job"):
            cancel_and_wait(str(props["job"]))


class AzuremlJobGuard(pulumi.dynamic.Resource, module="azureml", name="JobGuard"):
    job: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        job: pulumi.Input[str],
        label: str,
        protect_running: bool,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {"job": job, "label": label, "protect_running": protect_running}
        super().__init__(AzuremlJobGuardProvider(), name, props, opts)
