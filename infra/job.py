"""The training job as a stack resource: ``TrainingJob``, a Pulumi dynamic resource whose
provider adds, refreshes, replaces and deletes one Batch job and its multi-instance task with
``azure-batch`` 15.x and Entra credentials (payloads: ``infra.batch``; what runs on the nodes:
docs/deploy.md). Azure SDK imports stay inside functions: the provider host imports this module
for every operation, so nothing here may pull in torch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, TypeVar

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, UpdateResult

from infra import batch
from infra.batch import (
    NOT_THE_IDENTITY,
    RESTATED,
    RUNNING_STATES,
    TASK_ID,
    JobFields,
    JobSpec,
    error_code,
    job_options,
    live_folder_url,
    poll_succeeded,
    state_text,
    task_options,
    terminate_options,
    wall_clock_limit,
)
from infra.dynamic import OneLineError, Provider
from infra.settings.jobs import SHORTHAND_JOB
from infra.task_report import last_try_line
from trainer.common.errors import first_line, one_line

T = TypeVar("T")
# New role assignments take minutes to reach Batch's data plane: until then it answers 403
# (401 while a token is not accepted yet). Retry those with growing pauses for this long.
AUTH_RETRY_SECONDS = 600.0
FIRST_AUTH_RETRY_SECONDS = 2.0
MAX_AUTH_RETRY_SECONDS = 60.0
POLL_SECONDS = 5
DELETE_WAIT_SECONDS = 900.0
# Batch's control plane is eventually consistent and documents no window: a job can be 404
# JobNotFound right after its add succeeded (microsoft/CromwellOnAzure #483 retries Job - Get
# on JobNotFound after the commit). A 404 for a job this provider just made, or one a refresh
# finds missing, is believed only after this many further reads this far apart.
NOT_FOUND_RETRIES = 4
NOT_FOUND_PAUSE_SECONDS = 2.0
# The 409s that mean the work is done or under way already, not a failure (Batch error codes,
# BatchErrorCode in the REST reference): a retried add meets what its lost answer made.
TERMINATE_UNDER_WAY = ("JobBeingTerminated", "JobCompleted")


class JobError(OneLineError):
    """A Batch call failed; one line naming the job, the call and the fix."""


class AccessRefused(JobError):
    """Batch kept refusing the caller (401/403) for as long as the call would wait."""

    def __init__(self, refusal: str, waited: float) -> None:
        self.refusal = refusal  # "Batch at <endpoint> refused to <what> (<status> <code>)"
        super().__init__(
            f"{refusal} for {waited:.0f} s: give the deployer a Batch data-plane role on the "
            "account (e.g. Azure Batch Job Submitter), wait for the role assignment to "
            "propagate, then run `pulumi up` again"
        )


def _error_code(err: Any) -> str:
    model = getattr(err, "model", None)
    return str(getattr(model, "code", None) or getattr(err, "reason", None) or "no code")


def _call(
    endpoint: str,
    what: str,
    call: Callable[[], T],
    auth_wait: float | None = None,
    expected: tuple[str, ...] = (),
) -> T:
    """``call()``, retrying Batch's authorization failures (401/403) with exponential backoff
    for up to ``auth_wait`` seconds (default ``AUTH_RETRY_SECONDS``): a role assignment made
    by this deployment takes minutes to reach the data plane. Then ``AccessRefused``; other
    Batch errors become one line; ``ResourceNotFoundError`` and the errors whose Batch code is
    in ``expected`` pass through for the caller."""
    from trainer.common.azure_sdk import AzureError, HttpResponseError, ResourceNotFoundError

    limit = AUTH_RETRY_SECONDS if auth_wait is None else auth_wait

    delay = FIRST_AUTH_RETRY_SECONDS
    waited = 0.0
    while True:
        try:
            return call()
        except ResourceNotFoundError:
            raise
        except HttpResponseError as err:
            if error_code(err) in expected:
                raise
            if err.status_code not in (401, 403):
                raise JobError(f"{what} at {endpoint} failed: {first_line(err)}") from None
            refused = (
                f"Batch at {endpoint} refused to {what} ({err.status_code} {_error_code(err)})"
            )
            if waited + delay > limit:
                raise AccessRefused(refused, waited) from None
            pulumi.log.warn(
                f"{refused}; a new role assignment can take minutes to propagate: "
                f"retrying in {delay:g} s"
            )
            time.sleep(delay)
            waited += delay
            delay = min(delay * 2, MAX_AUTH_RETRY_SECONDS)
        except AzureError as err:
            raise JobError(f"{what} at {endpoint} failed: {first_line(err)}") from None


def _seen(endpoint: str, what: str, call: Callable[[], T], **options: Any) -> T:
    """``_call`` that believes a 404 only once ``NOT_FOUND_RETRIES`` more calls got it too."""
    from trainer.common.azure_sdk import ResourceNotFoundError

    for _ in range(NOT_FOUND_RETRIES):
        try:
            return _call(endpoint, what, call, **options)
        except ResourceNotFoundError:
            time.sleep(NOT_FOUND_PAUSE_SECONDS)
    return _call(endpoint, what, call, **options)


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


class TrainingJobProvider(Provider):
    # A dynamic provider because Batch jobs and tasks exist only in Batch's data plane: the ARM
    # provider Microsoft.Batch has accounts, pools, applications and certificates, no jobs
    # (Azure/azure-rest-api-specs, specification/batch/resource-manager), so azure-native
    # cannot declare them.
    # Renaming or moving this class breaks refresh and destroy of existing stacks: the SDK
    # pickles it by reference (module and name) into every job's ``__provider`` input.

    def create(self, props: dict[str, Any]) -> CreateResult:
        from infra.azure_sdk import batch_models as m

        spec = JobSpec.from_props(props)
        client = batch.client(spec.endpoint)
        job_id = spec.job_id
        ran = self._add_job(spec, client)
        if ran is not None:
            return CreateResult(job_id, {**props, **job_outputs(spec, state_text(ran.state))})
        try:
            # Batch may not show a job it has just added (404): every call on it waits for it.
            _add_task(spec, client)
            # Batch's REST reference (Job - Add, onAllTasksComplete): a job without tasks counts
            # as complete, so create it with noaction and switch to terminatejob once the tasks
            # are added; the job then ends when its task does.
            _seen(
                spec.endpoint,
                f"update job {job_id}",
                lambda: client.update_job(
                    job_id, m.BatchJobUpdateOptions(all_tasks_complete_mode="terminatejob")
                ),
            )
        except Exception:
            # No job without its task, nor one that never ends: it would hold the pool.
            try:
                self._delete(spec.endpoint, job_id, fresh=True)
            except JobError as cleanup:
                pulumi.log.warn(f"job {job_id} was left behind: {cleanup}")
            raise
        job = _seen(spec.endpoint, f"read job {job_id}", lambda: client.get_job(job_id))
        return CreateResult(job_id, {**props, **job_outputs(spec, state_text(job.state))})

    @classmethod
    def _add_job(cls, spec: JobSpec, client: Any) -> Any:
        """Add the job. None when it is there to get its task: added now, or found under its
        id (409 JobExists) still active: the job a lost answer made (the SDK resends a job add
        that got 503, Azure/azure-sdk-for-net #36549) or an older failed create's, which has
        these very inputs (the id hashes them). An older job that already ran is adopted as it
        is and returned: its task's record and files stay. One that ended without its task, or
        is being deleted, held nothing: it goes, and the job is added again."""
        from trainer.common.azure_sdk import HttpResponseError, ResourceNotFoundError

        endpoint, job_id = spec.endpoint, spec.job_id
        what, read = f"create job {job_id}", f"read job {job_id}"

        def now() -> str:
            return state_text(_call(endpoint, read, lambda: client.get_job(job_id)).state)

        for _ in range(4):  # at most: terminating, completed (deleted), gone, added
            try:
                add = lambda: client.create_job(job_options(spec))  # noqa: E731
                _call(endpoint, what, add, expected=("JobExists",))
                return None
            except HttpResponseError:
                pass
            try:
                job = _seen(endpoint, read, lambda: client.get_job(job_id))
            except ResourceNotFoundError:
                continue  # deleted since: add it again
            if foreign := _foreign(spec, job):
                raise JobError(
                    f"{what} at {endpoint} failed: a job this stack did not make has its id "
                    f"({foreign}): delete it in the portal, then run `pulumi up` again"
                )
            state = state_text(job.state)
            if state in RUNNING_STATES:
                pulumi.log.info(f"job {job_id} was there already ({state}): adopted it")
                return None
            if state in ("terminating", "deleting"):
                batch.wait_while(now, state, POLL_SECONDS, DELETE_WAIT_SECONDS)
                continue
            task = _call(
                endpoint, f"read task of job {job_id}", lambda: _task_or_none(client, job_id)
            )
            if task is not None:
                pulumi.log.warn(_ran_message(job_id, state))
                return job
            cls._delete(endpoint, job_id)
        raise JobError(
            f"{what} at {endpoint} failed: a job with its id is still there (JobExists): look "
            "at the job in the portal, then run `pulumi up` again"
        )

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Both sides are read into a JobSpec, the one place inputs are normalised: the engine
        # keeps numbers as floats and sequences as lists, and a field added later is absent
        # from older state, which means its default (tests/infra/test_job_upgrade.py holds
        # every released shape). ``protect_running`` is this deployment's permission and the
        # outputs are Batch's: neither is the job.
        old, new = JobSpec.from_props(olds), JobSpec.from_props(news)
        changed = [
            f.name
            for f in fields(JobSpec)
            if f.name not in RESTATED and getattr(old, f.name) != getattr(new, f.name)
        ]
        # A new wall-clock limit is set on the job in place (``update``); only a removed one
        # needs a new job (Job - Update documents no way to clear it).
        in_place = [key for key in changed if key in NOT_THE_IDENTITY and getattr(new, key)]
        changed = [key for key in changed if key not in in_place]
        if in_place and not changed:
            return DiffResult(changes=True, replaces=[], delete_before_replace=False)
        if changed and news.get("protect_running"):
            state = self._running_state(id_, olds)
            if state and changed == ["image_ref"]:
                # A new image (any change to the trainer) waits for the run: the job keeps
                # the image it started with, in its state too, so the replacement comes with
                # the first `pulumi up` after it ends. Nothing else of the stack waits for it;
                # a new limit still reaches the running job (``update`` keeps the image).
                pulumi.log.warn(_keeps_image_message(id_, olds, news, state))
                return DiffResult(changes=bool(in_place), replaces=[])
            if state:
                raise JobError(_refusal(id_, news, state, changed))
        return DiffResult(
            changes=bool(changed), replaces=changed, delete_before_replace=bool(changed)
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """Sets the job's new wall-clock limit (the one change ``diff`` makes in place, also
        while a running job keeps its image); a job that has ended, or is gone, keeps what it
        had. Batch counts the limit from the job's creation, so a running job that has run
        longer than the new limit (an upgrade's default on a job older than that) keeps its
        own: the limit would stop it at once."""
        from infra.azure_sdk import batch_models as m
        from trainer.common.azure_sdk import ResourceNotFoundError

        spec = JobSpec.from_props(news)
        client = batch.client(spec.endpoint)
        try:
            job = _seen(spec.endpoint, f"read job {id_}", lambda: client.get_job(id_))
        except ResourceNotFoundError:
            job = None
        state = state_text(job.state) if job is not None else str(olds.get("state") or "")
        if job is not None and state in RUNNING_STATES:
            ran = _hours_since(getattr(job, "creation_time", None))
            if ran is not None and ran >= spec.max_wall_clock_hours:
                pulumi.log.warn(
                    f"job {id_} has run {ran:.0f} h, past its new wall-clock limit of "
                    f"{spec.max_wall_clock_hours} h (counted from its creation): it keeps its "
                    "own limit, and the next job gets the new one"
                )
            else:
                limit = wall_clock_limit(spec.max_wall_clock_hours)
                update = m.BatchJobUpdateOptions(constraints=limit)
                _seen(spec.endpoint, f"update job {id_}", lambda: client.update_job(id_, update))
        # The job as it was (its outputs, and the image it runs, which a protected running job
        # keeps: ``diff``) with its new limit.
        kept = {key: olds[key] for key in (*OUTPUT_KEYS, "image_ref") if key in olds}
        return UpdateResult({**news, **kept, "state": state})

    @staticmethod
    def _running_state(id_: str, olds: dict[str, Any]) -> str | None:
        """protectRunningJobs: a replace deletes the running job (its task checkpoints on the
        terminate first). The job's state when tasks may still run, else None; its live state
        decides, the recorded one when Batch cannot say."""
        from trainer.common.azure_sdk import AzureError, ResourceNotFoundError

        state = str(olds.get("state") or "")
        endpoint = olds.get("endpoint")
        if endpoint:
            try:
                state = state_text(batch.client(endpoint).get_job(id_).state)
            except ResourceNotFoundError:
                return None  # gone already: nothing to protect
            except AzureError:
                pass
        return state if state in RUNNING_STATES else None

    # Read and delete use only the endpoint and the id: the state of an existing stack was
    # written by an older version of this provider, with other inputs than ``JobSpec`` has now.

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from trainer.common.azure_sdk import ResourceNotFoundError

        endpoint = props["endpoint"]
        client = batch.client(endpoint)
        # A refresh makes no role assignment to wait for: a refusal is an operator without a
        # Batch role (a colleague's preview of a stack CI deployed), who still gets a preview.
        try:
            # Not gone on the first 404: a refresh right after create may not see the job yet.
            job = _seen(endpoint, f"read job {id_}", lambda: client.get_job(id_), auth_wait=0)
            task = _call(
                endpoint,
                f"read task of job {id_}",
                lambda: _task_or_none(client, id_),
                auth_wait=0,
            )
        except ResourceNotFoundError:
            return ReadResult(None, {})  # deleted outside Pulumi: gone from the stack too
        except AccessRefused as refused:
            pulumi.log.warn(
                f"{refused.refusal}: kept job {id_}'s state as last recorded; to read it, ask "
                "for the Azure Batch Job Submitter role on the account (the stack's "
                "jobSubmitterObjectId group)"
            )
            return ReadResult(id_, props)
        live: dict[str, Any] = {"state": state_text(job.state)}
        if task is not None:
            info = task.execution_info
            live["task_state"] = state_text(task.state)
            live["retries"] = info.retry_count if info is not None else 0
            if info is not None and (info.retry_count or info.exit_code):
                # A retry that starts replaces the file the line is read from: the line the
                # last refresh read stays until another try has ended.
                live["last_try"] = last_try_line(client, id_) or props.get("last_try")
        # State written before metrics_url was an output has the log URL it derives from.
        if metrics_url := props.get("metrics_url") or _metrics_url(props.get("log_url")):
            live["metrics_url"] = metrics_url
            live.update(_progress(id_, metrics_url, props))
        if props.get("pool_id"):
            live["pool_errors"] = _pool_errors(client, id_, props)
        return ReadResult(id_, {**props, **live})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        self._delete(props["endpoint"], id_)

    @staticmethod
    def _delete(endpoint: str, job_id: str, fresh: bool = False) -> None:
        """Terminate the job if tasks may run, delete it, and wait until Batch no longer has it;
        a job that is gone already is fine. ``fresh``: the job was just added, so a 404 is
        believed only once it persists (``_seen``)."""
        from trainer.common.azure_sdk import HttpResponseError, ResourceNotFoundError

        client = batch.client(endpoint)

        def read() -> str:
            return state_text(
                _call(endpoint, f"read job {job_id}", lambda: client.get_job(job_id)).state
            )

        try:
            state = _seen(endpoint, f"read job {job_id}", read) if fresh else read()
            if state in RUNNING_STATES:
                try:
                    poller = _call(
                        endpoint,
                        f"terminate job {job_id}",
                        lambda: client.begin_terminate_job(
                            job_id, terminate_options(), polling_interval=POLL_SECONDS
                        ),
                        expected=TERMINATE_UNDER_WAY,
                    )
                    poll_succeeded(poller, DELETE_WAIT_SECONDS)  # not trusted: read again
                except HttpResponseError:
                    pass  # another terminate (a cancel's) is under way or done: wait for it
                state = read()
            if state == "terminating":  # the tasks checkpoint on their SIGTERM: let them
                state = batch.wait_while(read, state, POLL_SECONDS, DELETE_WAIT_SECONDS)
                if state is None:
                    return
            if state != "deleting":
                try:
                    poller = _call(
                        endpoint,
                        f"delete job {job_id}",
                        lambda: client.begin_delete_job(job_id, polling_interval=POLL_SECONDS),
                        expected=("JobBeingDeleted",),
                    )
                    poll_succeeded(poller, DELETE_WAIT_SECONDS)  # not trusted: the loop reads
                except HttpResponseError:
                    pass  # JobBeingDeleted: an earlier delete's; the loop waits for it
            deadline = time.monotonic() + DELETE_WAIT_SECONDS
            while (state := read()) == "deleting" and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
        except ResourceNotFoundError:
            return
        raise JobError(
            f"job {job_id} at {endpoint} is still {state} after its delete: look at the job "
            "in the portal, then run the operation again"
        )


def _add_task(spec: JobSpec, client: Any) -> None:
    from trainer.common.azure_sdk import HttpResponseError

    job_id = spec.job_id
    # TaskExists: the job's one task is there, added by a lost answer's retry or an older create.
    with contextlib.suppress(HttpResponseError):
        _seen(
            spec.endpoint,
            f"add task {TASK_ID} to job {job_id}",
            lambda: client.create_task(job_id, task_options(spec)),
            expected=("TaskExists",),
        )


def _foreign(spec: JobSpec, job: Any) -> str | None:
    """None when the job under ``spec``'s id is one this stack made (``job_options``: its
    metadata and pool); else what it is, for the error."""
    metadata = {item.name: item.value for item in job.metadata or []}
    pool = getattr(job.pool_info, "pool_id", None)
    wanted = {"stack": spec.stack, "run": spec.run_name}
    if all(metadata.get(k) == v for k, v in wanted.items()) and pool == spec.pool_id:
        return None
    return ", ".join([*(f"{k}={metadata.get(k)}" for k in wanted), f"pool={pool}"])


def _ran_message(job_id: str, state: str) -> str:
    return (
        f"job {job_id} already ran with these inputs ({state}): an earlier `pulumi up` made it "
        "and did not record it; adopted it as it is, with its logs and results. To run it "
        "again, `pulumi up --replace` its URN (it resumes from its newest checkpoint)"
    )


# The words the preview's jobs summary (dt_commands/preview_jobs.py) finds this warning by.
KEEPS_IMAGE = "keeps the image it started with"


def _keeps_image_message(id_: str, olds: dict[str, Any], news: dict[str, Any], state: str) -> str:
    name = news.get("name") or SHORTHAND_JOB
    return (
        f"job {name} ({id_}) is {state} and {KEEPS_IMAGE} ({olds.get('image_ref')}); "
        f"{_known(news.get('image_ref'), 'a new image (known after the build)')} replaces it "
        f"with the first `pulumi up` after it ends, or now with {name} in replaceJobs (it "
        "resumes from its newest checkpoint)"
    )


def _known(value: Any, instead: str) -> str:
    """``value`` where a preview knows it; ``instead`` where the engine sent it unknown (a
    ``pulumi.output.Unknown``, or the wire's unknown sentinel)."""
    from pulumi.runtime.rpc import UNKNOWN

    return value if isinstance(value, str) and value != UNKNOWN else instead


def _refusal(id_: str, news: dict[str, Any], state: str, changed: list[str]) -> str:
    name = news.get("name") or SHORTHAND_JOB
    return (
        f"job {name} ({id_}) is {state}, and this change would replace it "
        f"({', '.join(sorted(changed))}): let it finish, cancel it "
        f"(dt-jobs cancel --stack <stack> --job {name}), or add {name} to "
        "replaceJobs; a replacement with the same training settings resumes from its "
        "newest checkpoint"
    )


def _task_or_none(client: Any, job_id: str) -> Any:
    """The job's task; None for a job whose task was never added (or was deleted)."""
    from trainer.common.azure_sdk import ResourceNotFoundError

    try:
        return client.get_task(job_id, TASK_ID)
    except ResourceNotFoundError:
        return None


def _pool_errors(client: Any, job_id: str, props: dict[str, Any]) -> list[str]:
    """Why the pool gives the job no nodes (infra.pool_health), one line each with the fix; a
    refresh never fails on it: what it cannot read is a warning."""
    from infra.pool_health import pool_problems
    from trainer.common.azure_sdk import AzureError

    name = props.get("name") or SHORTHAND_JOB
    stack = props.get("stack")
    hint = f"cancel the job (dt-jobs cancel --stack {stack} --job {name})"
    try:
        problems = pool_problems(client, props["pool_id"], hint, job_id=job_id)
    except AzureError as err:
        pulumi.log.warn(f"job {job_id}: pool {props['pool_id']} not read: {first_line(err)}")
        return []
    for line in problems:
        pulumi.log.warn(f"job {job_id}: {line}")
    return problems


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


def _metrics_url(log_url: Any) -> str | None:
    return live_folder_url(log_url) if isinstance(log_url, str) and log_url else None


def _hours_since(moment: Any) -> float | None:
    """Hours from ``moment`` (a datetime Batch reported) to now; None when Batch gave none."""
    if not isinstance(moment, datetime):
        return None
    return (_now() - moment).total_seconds() / 3600


def _now() -> datetime:
    return datetime.now(UTC)


def _progress(job_id: str, metrics_url: str, recorded: dict[str, Any]) -> dict[str, Any]:
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
    minutes = max(0, int((_now() - at).total_seconds() // 60))
    days, hours, minutes = minutes // 1440, minutes // 60 % 24, minutes % 60
    age = " ".join(f"{n} {u}" for n, u in ((days, "d"), (hours, "h"), (minutes, "min")) if n)
    return f"; {shown} {verb} as of {recorded['progress_at']} ({age or '0 min'} ago)"


@dataclass(frozen=True)
class TrainingJobArgs(JobFields[pulumi.Input[str]]):
    """A job's fields (``infra.batch.JobFields``; the resources' properties may be Outputs)."""

    # protectRunningJobs and not in replaceJobs: a change that would replace the job while it
    # runs stops the preview or update instead.
    protect_running: bool = False


class TrainingJob(pulumi.dynamic.Resource):
    job_id: pulumi.Output[str]
    state: pulumi.Output[str]
    task_state: pulumi.Output[str]
    retries: pulumi.Output[int]
    step: pulumi.Output[int]
    images_per_sec: pulumi.Output[float]
    tokens_per_sec: pulumi.Output[float]
    progress_at: pulumi.Output[str]
    progress_error: pulumi.Output[str]
    pool_errors: pulumi.Output[list[str]]
    """The pool's resize errors and start-task failures as of the last refresh (one line each,
    with the fix); empty when there are none."""
    stragglers: pulumi.Output[list[str]]
    last_try: pulumi.Output[str]
    """How the task's last failed try ended, as of the last refresh that could read it: the node
    whose rank failed it and how to keep that node out (``infra.task_report``)."""
    portal_url: pulumi.Output[str]
    log_url: pulumi.Output[str]
    metrics_url: pulumi.Output[str]
    outputs_url: pulumi.Output[str]
    checkpoint_path: pulumi.Output[str]

    def __init__(
        self, name: str, args: TrainingJobArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props: dict[str, Any] = {f.name: getattr(args, f.name) for f in fields(args)}
        props["endpoint"] = pulumi.Output.from_input(args.endpoint).apply(batch.endpoint_url)
        props["trainer_args"] = list(args.trainer_args)
        props["command"] = list(args.command)
        props["trainer_settings"] = [list(pair) for pair in args.trainer_settings]
        props.update({key: None for key in OUTPUT_KEYS})
        super().__init__(
            TrainingJobProvider(),
            name,
            props,
            # Any input change replaces the job; the old one goes first, so the new job gets
            # the pool at once.
            pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(delete_before_replace=True)),
        )
