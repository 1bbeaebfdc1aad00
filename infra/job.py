"""The training job as a stack resource: ``TrainingJob``, a Pulumi dynamic resource whose
provider adds, refreshes, replaces and deletes one Batch job and its multi-instance task with
``azure-batch`` 15.x and Entra credentials (payloads: ``infra.batch``; what runs on the nodes:
docs/deploy.md). Azure SDK imports stay inside functions: the provider host imports this module
for every operation, so nothing here may pull in torch.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, fields
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, UpdateResult

from infra import batch
from infra.batch import (
    RUNNING_STATES,
    TASK_ID,
    job_options,
    poll_succeeded,
    state_text,
    task_options,
    terminate_options,
)
from infra.batch_calls import AccessRefused, JobError, batch_call, batch_call_seen
from infra.dynamic import Provider
from infra.job_outputs import (
    OUTPUT_KEYS,
    hours_since,
    job_outputs,
    metrics_folder_url,
    read_progress,
)
from infra.job_spec import NOT_THE_IDENTITY, RESTATED, JobFields, JobSpec, wall_clock_limit
from infra.settings.jobs import SHORTHAND_JOB
from infra.task_report import last_try_line
from trainer.common.errors import first_line

POLL_SECONDS = 5
DELETE_WAIT_SECONDS = 900.0
# The 409s that mean the work is done or under way already, not a failure (Batch error codes,
# BatchErrorCode in the REST reference): a retried add meets what its lost answer made.
TERMINATE_UNDER_WAY = ("JobBeingTerminated", "JobCompleted")


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
            batch_call_seen(
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
        job = batch_call_seen(spec.endpoint, f"read job {job_id}", lambda: client.get_job(job_id))
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
            return state_text(batch_call(endpoint, read, lambda: client.get_job(job_id)).state)

        for _ in range(4):  # at most: terminating, completed (deleted), gone, added
            try:
                add = lambda: client.create_job(job_options(spec))  # noqa: E731
                batch_call(endpoint, what, add, expected=("JobExists",))
                return None
            except HttpResponseError:
                pass
            try:
                job = batch_call_seen(endpoint, read, lambda: client.get_job(job_id))
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
            task = batch_call(
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
        old, new = JobSpec.from_props(olds), JobSpec.from_props(_tracking_known(olds, news))
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
            job = batch_call_seen(spec.endpoint, f"read job {id_}", lambda: client.get_job(id_))
        except ResourceNotFoundError:
            job = None
        state = state_text(job.state) if job is not None else str(olds.get("state") or "")
        if job is not None and state in RUNNING_STATES:
            ran = hours_since(getattr(job, "creation_time", None))
            if ran is not None and ran >= spec.max_wall_clock_hours:
                pulumi.log.warn(
                    f"job {id_} has run {ran:.0f} h, past its new wall-clock limit of "
                    f"{spec.max_wall_clock_hours} h (counted from its creation): it keeps its "
                    "own limit, and the next job gets the new one"
                )
            else:
                limit = wall_clock_limit(spec.max_wall_clock_hours)
                update = m.BatchJobUpdateOptions(constraints=limit)
                batch_call_seen(
                    spec.endpoint, f"update job {id_}", lambda: client.update_job(id_, update)
                )
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
            job = batch_call_seen(
                endpoint, f"read job {id_}", lambda: client.get_job(id_), auth_wait=0
            )
            task = batch_call(
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
        if metrics_url := props.get("metrics_url") or metrics_folder_url(props.get("log_url")):
            live["metrics_url"] = metrics_url
            live.update(read_progress(id_, metrics_url, props))
        if props.get("pool_id"):
            live["pool_errors"] = _pool_errors(client, id_, props)
        return ReadResult(id_, {**props, **live})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        self._delete(props["endpoint"], id_)

    @staticmethod
    def _delete(endpoint: str, job_id: str, fresh: bool = False) -> None:
        """Terminate the job if tasks may run, delete it, and wait until Batch no longer has it;
        a job that is gone already is fine. ``fresh``: the job was just added, so a 404 is
        believed only once it persists (``batch_call_seen``)."""
        from trainer.common.azure_sdk import HttpResponseError, ResourceNotFoundError

        client = batch.client(endpoint)

        def read() -> str:
            return state_text(
                batch_call(endpoint, f"read job {job_id}", lambda: client.get_job(job_id)).state
            )

        try:
            state = batch_call_seen(endpoint, f"read job {job_id}", read) if fresh else read()
            if state in RUNNING_STATES:
                try:
                    poller = batch_call(
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
                    poller = batch_call(
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
        batch_call_seen(
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


def _tracking_known(olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
    """``news``, where a preview does not know a tracking value yet, with the job's own value
    for it. The stack's workspace's URI is unknown while the workspace updates in place
    (azure-native previews an update with its inputs and only the outputs that never change),
    which would show every job replaced, and a running one refused, for a tag. The update's
    own diff, run with the value known, compares it."""
    from pulumi.runtime.rpc import UNKNOWN

    old_pairs = {name: value for name, value in olds.get("tracking") or ()}
    pairs = [list(pair) for pair in news.get("tracking") or ()]
    if not any(value == UNKNOWN for _, value in pairs) or {n for n, _ in pairs} != set(old_pairs):
        return news
    return {**news, "tracking": [[n, old_pairs[n] if v == UNKNOWN else v] for n, v in pairs]}


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


@dataclass(frozen=True)
class TrainingJobArgs(JobFields[pulumi.Input[str]]):
    """A job's fields (``infra.job_spec.JobFields``; the resources' properties may be Outputs)."""

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
