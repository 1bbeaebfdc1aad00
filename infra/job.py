"""The training job as a stack resource: a Pulumi dynamic resource over ``azure-batch`` 15.x.

Batch jobs are data-plane objects (no ARM resource), so ``TrainingJobProvider`` creates the job
and its multi-instance task with Entra credentials (``DefaultAzureCredential``; the deployer
holds the Batch data-plane roles). Any input change replaces the job (delete before replace:
the new job reuses the pool at once); delete terminates and deletes it; read refreshes its
state. The payloads are built from azure-batch's own model classes by pure functions, so tests
check them without Azure. Azure SDK imports stay inside functions: Pulumi pickles the provider
(by reference), and the provider host imports this module for every operation, so nothing here
may pull in torch.

On the nodes: every node runs ``trainer.launch`` in the stack's image (host network and IPC,
InfiniBand devices, unlimited locked memory, the VM's NCCL topology files), in the foreground
of the multi-instance task's coordination command; the application command, which Batch runs
on the primary only after every node's coordination command returned, prints every node's
launcher log from the run folder and exits with the recorded outcome. Checkpoints live on the
NFS share under a folder named by the trainer settings, so a task retry, a replaced job with
new code, or a job after ``pulumi up`` resumes from the newest checkpoint. stdout/stderr go to
the ``logs`` container with the nodes' managed identity when the task ends.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, TypeVar

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, ResourceProvider

from infra import batch
from infra.batch import TASK_ID, poll_succeeded, state_text, terminate_options
from infra.cluster import NFS_RELATIVE_MOUNT
from infra.dynamic import changed_inputs
from infra.live_metrics import LIVE_FOLDER
from infra.sizes import size_of
from trainer.launch.fabric import SIZES, preflight_floor

T = TypeVar("T")
MAX_TASK_RETRIES = 3
# No --gpus: Batch enables the GPUs for container tasks on GPU pools itself and documents not
# passing it (articles/batch/batch-docker-container-workloads.md).
CONTAINER_RUN_OPTIONS = (
    "--network host --ipc host --shm-size 64g "
    "--ulimit memlock=-1 --ulimit stack=67108864 "
    "--device /dev/infiniband --cap-add IPC_LOCK "
    "-v /opt/microsoft:/opt/microsoft:ro"  # NCCL topology files of the Azure HPC image
)
# A size without InfiniBand (the CPU acceptance size) has no /dev/infiniband, and docker refuses
# to create a container whose --device path is missing ("error gathering device information
# while adding custom device ...: no such file or directory", moby/moby #41280); nor has it the
# ND sizes' topology files. Host networking stays: the launchers meet on the nodes' addresses.
CPU_CONTAINER_RUN_OPTIONS = (
    "--network host --ipc host --shm-size 2g --ulimit memlock=-1 --ulimit stack=67108864"
)
NFS_ROOT = f"${{AZ_BATCH_NODE_MOUNTS_DIR}}/{NFS_RELATIVE_MOUNT}"
DATASET_ROOT = "${AZ_BATCH_NODE_SHARED_DIR}/datasets"  # each node's local disk
# New role assignments take minutes to reach Batch's data plane: until then it answers 403
# (401 while a token is not accepted yet). Retry those with growing pauses for this long.
AUTH_RETRY_SECONDS = 600.0
FIRST_AUTH_RETRY_SECONDS = 2.0
MAX_AUTH_RETRY_SECONDS = 60.0
POLL_SECONDS = 5
DELETE_WAIT_SECONDS = 900.0
# Job states in which tasks may still run: terminate before delete so the launchers get SIGTERM
# and checkpoint (a delete removes the task data at once).
RUNNING_STATES = ("active", "disabling", "disabled", "enabling")


class JobError(RuntimeError):
    """A Batch call failed; one line naming the job, the call and the fix."""


@dataclass(frozen=True)
class JobSpec:
    """Everything the job payloads depend on, as plain values."""

    stack: str
    endpoint: str  # https://<account>.<region>.batch.azure.com
    account_id: str
    pool_id: str
    node_count: int
    vm_size: str
    image_ref: str  # <registry>/trainer:<tag>@sha256:...
    registry_server: str
    node_identity_id: str
    node_identity_client_id: str
    blob_endpoint: str  # https://<account>.blob.core.windows.net/
    trainer_args: tuple[str, ...]  # python -m trainer flags (without --output-dir)
    dataset_prefix: str  # "" trains on what trainer_args say; else staged shards
    # A job of the stack's `jobs` map; "" for the one job of the submitJob shorthand. Left out
    # of the hashes below at these defaults, so the shorthand's job id and run folder are the
    # ones stacks had before the jobs map existed (no replaced job on upgrade).
    name: str = ""
    priority: int = 0  # Batch job priority, -1000..1000

    def _identity(self) -> dict[str, Any]:
        values = asdict(self)
        for field_ in fields(self):
            if field_.default is not MISSING and values[field_.name] == field_.default:
                del values[field_.name]
        return values

    @property
    def job_id(self) -> str:
        """Stable for the same inputs, new for any change (Batch ids cannot be reused at once)."""
        payload = json.dumps(self._identity(), sort_keys=True).encode()
        prefix = f"{self.stack}-{self.name}" if self.name else self.stack
        return f"{prefix}-{hashlib.sha256(payload).hexdigest()[:10]}"[-64:]

    @property
    def run_name(self) -> str:
        return run_name(self.trainer_args, self.dataset_prefix, self.name)

    @property
    def checkpoint_path(self) -> str:
        return f"{NFS_RELATIVE_MOUNT}/runs/{self.stack}/{self.run_name}"

    @property
    def log_url(self) -> str:
        return f"{self.blob_endpoint.rstrip('/')}/logs/{self.job_id}/"

    @property
    def metrics_url(self) -> str:
        """Where rank 0 uploads metrics.jsonl and the TensorBoard events while it trains."""
        return f"{self.log_url}{LIVE_FOLDER}"

    @property
    def portal_url(self) -> str:
        return f"https://portal.azure.com/#resource{self.account_id}/jobs"

    @classmethod
    def from_props(cls, props: dict[str, Any]) -> JobSpec:
        # A field this version added is absent from older state: its default, as then.
        values = {f.name: props.get(f.name, f.default) for f in fields(cls)}
        values["trainer_args"] = tuple(values["trainer_args"])
        values["node_count"] = int(values["node_count"])
        return cls(**values)


def run_name(trainer_args: Sequence[str], dataset_prefix: str, name: str) -> str:
    """Names a job's checkpoint folder: the same training settings of the same job resume the
    same run; two jobs never share one."""
    settings = [tuple(trainer_args), dataset_prefix, *([name] if name else [])]
    return hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:12]


# A word may start with one of Batch's variables (a folder on the node); bash expands only that.
_BATCH_VARIABLE = re.compile(r"\$\{AZ_BATCH_[A-Z0-9_]+\}")


def _word(part: str) -> str:
    """One bash word: a leading ``${AZ_BATCH_...}`` in double quotes (expanded on the node),
    everything else single-quoted, so no value (a dataset prefix, a trainer flag) is ever run
    or expanded."""
    variable = _BATCH_VARIABLE.match(part)
    if variable is None:
        return shlex.quote(part)
    rest = part[variable.end() :]
    return f'"{variable.group()}"' + (shlex.quote(rest) if rest else "")


def _shell(*parts: str) -> str:
    """A bash command line of ``parts``, one word each."""
    return " ".join(_word(part) for part in parts)


def _in_bash(command: str) -> str:
    """A task command line: Batch runs it without a shell, as the container's CMD after the
    image's ENTRYPOINT (MicrosoftDocs/azure-docs #94943; the trainer image has none), so bash
    expands the Batch variables. ``exec``: the program becomes the container's first process
    and receives the SIGTERM of a terminate itself."""
    return f"/bin/bash -c {shlex.quote('exec ' + command)}"


def container_run_options(vm_size: str) -> str:
    """The InfiniBand options on an IB size, none of them on a size without InfiniBand ports.
    A size this version does not know (an older stack's) keeps the InfiniBand options."""
    try:
        ib_ports = size_of(vm_size).ib_ports
    except KeyError:
        return CONTAINER_RUN_OPTIONS
    return CONTAINER_RUN_OPTIONS if ib_ports else CPU_CONTAINER_RUN_OPTIONS


def _container(spec: JobSpec):
    from azure.batch import models as m

    return m.BatchTaskContainerSettings(
        image_name=spec.image_ref,
        container_run_options=container_run_options(spec.vm_size),
        registry=m.ContainerRegistryReference(
            registry_server=spec.registry_server,
            identity_reference=m.BatchNodeIdentityReference(resource_id=spec.node_identity_id),
        ),
        container_host_batch_bind_mounts=[
            m.ContainerHostBatchBindMountEntry(source=source, is_read_only=False)
            for source in ("Task", "Shared", "VfsMounts", "JobPrep")
        ],
    )


def _identity_env(spec: JobSpec):
    from azure.batch import models as m

    # DefaultAzureCredential on the node picks the pool's user-assigned identity by client id.
    return [m.EnvironmentSetting(name="AZURE_CLIENT_ID", value=spec.node_identity_client_id)]


def with_preflight_floor(command: list[str], vm_size: str | None) -> list[str]:
    """The trainer command with the size's preflight floor (``trainer.launch.fabric``), unless
    it sets one. None on a size without InfiniBand (the CPU acceptance size): there is no
    baseline to hold it to; nor on a size this version does not know (an older stack's), which
    the launcher refuses on the node with a one-line error."""
    floor = preflight_floor(vm_size) if vm_size is not None and vm_size in SIZES else 0.0
    flag = "--preflight-min-busbw"
    if floor <= 0 or any(word == flag or word.startswith(f"{flag}=") for word in command):
        return command
    return [*command, flag, str(floor)]


def trainer_command(spec: JobSpec) -> list[str]:
    """The trainer's complete command line, as the launcher runs it on every node, with the
    settings the job owns: the engine, the staged data, the run folder on NFS, where rank 0
    copies its live metrics (the logs container, read from outside the private network by
    `python -m infra.ops metrics|tensorboard`), and the VM size's preflight floor: what runs
    follows from the job's inputs alone, and the launcher edits nothing. The command is not
    part of the job id or the run name (those hash the ``JobSpec``), so a change here
    replaces no job by itself."""
    args = ["python", "-m", "trainer", *spec.trainer_args, "--backend", "horovod"]
    if spec.dataset_prefix:
        args += ["--data", "shards", "--data-dir", f"{DATASET_ROOT}/{spec.dataset_prefix}"]
    command = [
        *args,
        "--output-dir",
        f"{NFS_ROOT}/runs/{spec.stack}/{spec.run_name}",
        "--metrics-upload-url",
        spec.metrics_url,
    ]
    return with_preflight_floor(command, spec.vm_size)


def stage_command(spec: JobSpec) -> list[str]:
    """``python -m trainer.data stage`` for the job's dataset (``trainer.data.transfer.stage_args``
    builds the same; importing it here would import torch through ``trainer.data``)."""
    return [
        "python",
        "-m",
        "trainer.data",
        "stage",
        "--account-url",
        spec.blob_endpoint,
        "--container",
        "datasets",
        "--prefix",
        spec.dataset_prefix,
        "--dest",
        f"{DATASET_ROOT}/{spec.dataset_prefix}",
    ]


def job_options(spec: JobSpec):
    """The job: on the stack's pool, stages data first if asked. Created with ``noaction``:
    Batch counts a job without tasks as complete, so ``terminatejob`` is set only once the task
    exists (see ``TrainingJobProvider.create``)."""
    from azure.batch import models as m

    preparation = None
    if spec.dataset_prefix:
        preparation = m.BatchJobPreparationTask(
            id="stage-data",
            command_line=_in_bash(_shell(*stage_command(spec))),
            container_settings=_container(spec),
            environment_settings=_identity_env(spec),
            wait_for_success=True,
            rerun_on_node_reboot_after_success=False,
            user_identity=m.UserIdentity(
                auto_user=m.AutoUserSpecification(scope="pool", elevation_level="nonadmin")
            ),
        )
    return m.BatchJobCreateOptions(
        id=spec.job_id,
        display_name=f"{spec.stack} {spec.name or 'training'}",
        pool_info=m.BatchPoolInfo(pool_id=spec.pool_id),
        priority=spec.priority,
        all_tasks_complete_mode="noaction",
        job_preparation_task=preparation,
        metadata=[
            m.BatchMetadataItem(name="stack", value=spec.stack),
            m.BatchMetadataItem(name="run", value=spec.run_name),
        ],
    )


def launch_command(spec: JobSpec, *mode: str) -> list[str]:
    """``trainer.launch`` in ``mode`` (``--defer-exit-code`` or ``--report``) over the trainer."""
    launch = ["python", "-m", "trainer.launch", "--vm-size", spec.vm_size, *mode, "--"]
    return [*launch, *trainer_command(spec)]


def task_options(spec: JobSpec):
    """The multi-instance task: one instance per node, ``trainer.launch`` on each."""
    from azure.batch import models as m

    # Batch runs the coordination command on every node (the primary too) at once, and the
    # application command on the primary only, after every coordination command returned 0
    # (articles/batch/batch-mpi.md). Whether a background process of the coordination command
    # outlives it in a container is not documented, so nothing runs in the background: the
    # launchers train in the foreground of the coordination command, tee their output into the
    # run folder on NFS and record their outcome there (exiting 0 once it is recorded); the
    # application command prints every node's log and exits with the recorded outcome, so a
    # failure anywhere fails the task (and Batch retries it, resuming from the checkpoints).
    # The training launchers also watch the VM's Scheduled Events: a Spot eviction's notice
    # (about 30 s) is enough for a checkpoint.
    coordination = _shell(*launch_command(spec, "--defer-exit-code", "--watch-scheduled-events"))
    application = _shell(*launch_command(spec, "--report"))
    return m.BatchTaskCreateOptions(
        id=TASK_ID,
        display_name=f"{spec.node_count} x {spec.vm_size}",
        command_line=_in_bash(application),
        container_settings=_container(spec),
        environment_settings=_identity_env(spec),
        multi_instance_settings=m.MultiInstanceSettings(
            number_of_instances=spec.node_count,
            coordination_command_line=_in_bash(coordination),
        ),
        # A retry resumes from the newest checkpoint on NFS (same run folder).
        constraints=m.BatchTaskConstraints(max_task_retry_count=MAX_TASK_RETRIES),
        user_identity=m.UserIdentity(
            auto_user=m.AutoUserSpecification(scope="pool", elevation_level="nonadmin")
        ),
        output_files=[
            m.OutputFile(
                file_pattern=pattern,
                destination=m.OutputFileDestination(
                    container=m.OutputFileBlobContainerDestination(
                        container_url=f"{spec.blob_endpoint.rstrip('/')}/logs",
                        path=f"{spec.job_id}/{name}",
                        identity_reference=m.BatchNodeIdentityReference(
                            resource_id=spec.node_identity_id
                        ),
                    )
                ),
                upload_options=m.OutputFileUploadConfiguration(upload_condition="taskcompletion"),
            )
            for pattern, name in (("../stdout.txt", "stdout.txt"), ("../stderr.txt", "stderr.txt"))
        ],
    )


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _error_code(err: Any) -> str:
    model = getattr(err, "model", None)
    return str(getattr(model, "code", None) or getattr(err, "reason", None) or "no code")


def _call(endpoint: str, what: str, call: Callable[[], T]) -> T:
    """``call()``, retrying Batch's authorization failures (401/403) with exponential backoff
    for up to ``AUTH_RETRY_SECONDS``: a role assignment made by this deployment takes minutes
    to reach the data plane. Other Batch errors become one line; ``ResourceNotFoundError``
    passes through for the caller to handle."""
    from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError

    delay = FIRST_AUTH_RETRY_SECONDS
    waited = 0.0
    while True:
        try:
            return call()
        except ResourceNotFoundError:
            raise
        except HttpResponseError as err:
            if err.status_code not in (401, 403):
                raise JobError(f"{what} at {endpoint} failed: {_first_line(err)}") from None
            refused = (
                f"Batch at {endpoint} refused to {what} ({err.status_code} {_error_code(err)})"
            )
            if waited + delay > AUTH_RETRY_SECONDS:
                raise JobError(
                    f"{refused} for {waited:.0f} s: give the deployer a Batch data-plane role "
                    "on the account (e.g. Azure Batch Job Submitter), wait for the role "
                    "assignment to propagate, then run `pulumi up` again"
                ) from None
            pulumi.log.warn(
                f"{refused}; a new role assignment can take minutes to propagate: "
                f"retrying in {delay:g} s"
            )
            time.sleep(delay)
            waited += delay
            delay = min(delay * 2, MAX_AUTH_RETRY_SECONDS)
        except AzureError as err:
            raise JobError(f"{what} at {endpoint} failed: {_first_line(err)}") from None


OUTPUT_KEYS = (
    "job_id",
    "state",
    "portal_url",
    "log_url",
    "metrics_url",
    "checkpoint_path",
    "task_state",
    "retries",
    "step",
    "images_per_sec",
)
# A refresh reads the job's uploaded metrics for its current step; it waits this long per try
# for a storage account it cannot reach (not in storageAllowedIps from here), then goes on.
PROGRESS_TIMEOUT_SECONDS = 10.0
NOT_THE_JOB = ("protect_running",)


class TrainingJobProvider(ResourceProvider):
    # Renaming or moving this class breaks refresh and destroy of existing stacks: the SDK
    # pickles it by reference (module and name) into every job's ``__provider`` input.

    def create(self, props: dict[str, Any]) -> CreateResult:
        from azure.batch import models as m

        spec = JobSpec.from_props(props)
        client = batch.client(spec.endpoint)
        job_id = spec.job_id
        _call(spec.endpoint, f"create job {job_id}", lambda: client.create_job(job_options(spec)))
        try:
            _call(
                spec.endpoint,
                f"add task {TASK_ID} to job {job_id}",
                lambda: client.create_task(job_id, task_options(spec)),
            )
            # Batch's REST reference (Job - Add, onAllTasksComplete): a job without tasks counts
            # as complete, so create it with noaction and switch to terminatejob once the tasks
            # are added; the job then ends when its task does.
            _call(
                spec.endpoint,
                f"update job {job_id}",
                lambda: client.update_job(
                    job_id, m.BatchJobUpdateOptions(all_tasks_complete_mode="terminatejob")
                ),
            )
        except Exception:
            # No job without its task, nor one that never ends: it would hold the pool.
            try:
                self._delete(spec.endpoint, job_id)
            except JobError as cleanup:
                pulumi.log.warn(f"job {job_id} was left behind: {cleanup}")
            raise
        job = _call(spec.endpoint, f"read job {job_id}", lambda: client.get_job(job_id))
        return CreateResult(job_id, {**props, **_outputs(spec, state_text(job.state))})

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # ``protect_running`` is this deployment's permission, not part of the job. A job
        # field added later is absent from older state, which means its default.
        defaults = {f.name: f.default for f in fields(JobSpec) if f.default is not MISSING}
        changed = changed_inputs(olds, news, (*OUTPUT_KEYS, *NOT_THE_JOB), defaults)
        if changed and news.get("protect_running"):
            self._refuse_replacing_a_running_job(id_, olds, news, changed)
        return DiffResult(
            changes=bool(changed), replaces=changed, delete_before_replace=bool(changed)
        )

    @staticmethod
    def _refuse_replacing_a_running_job(
        id_: str, olds: dict[str, Any], news: dict[str, Any], changed: list[str]
    ) -> None:
        """protectRunningJobs: a replace deletes the running job (its task checkpoints on the
        terminate first). Its live state decides; the recorded one when Batch cannot say."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        state = str(olds.get("state") or "")
        endpoint = olds.get("endpoint")
        if endpoint:
            try:
                state = state_text(batch.client(endpoint).get_job(id_).state)
            except ResourceNotFoundError:
                return  # gone already: nothing to protect
            except AzureError:
                pass
        if state not in RUNNING_STATES:
            return
        name = news.get("name") or "default"
        raise JobError(
            f"job {name} ({id_}) is {state}, and this change would replace it "
            f"({', '.join(sorted(changed))}): let it finish, cancel it "
            f"(python -m infra.ops cancel --stack <stack> --job {name}), or add {name} to "
            "replaceJobs; a replacement with the same training settings resumes from its "
            "newest checkpoint"
        )

    # Read and delete use only the endpoint and the id: the state of an existing stack was
    # written by an older version of this provider, with other inputs than ``JobSpec`` has now.

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from azure.core.exceptions import ResourceNotFoundError

        endpoint = props["endpoint"]
        client = batch.client(endpoint)
        try:
            job = _call(endpoint, f"read job {id_}", lambda: client.get_job(id_))
        except ResourceNotFoundError:
            return ReadResult(None, {})  # deleted outside Pulumi: gone from the stack too
        live: dict[str, Any] = {"state": state_text(job.state)}
        try:
            task = _call(endpoint, f"read task of job {id_}", lambda: client.get_task(id_, TASK_ID))
        except ResourceNotFoundError:
            task = None  # a job whose task was never added (or was deleted)
        if task is not None:
            info = task.execution_info
            live["task_state"] = state_text(task.state)
            live["retries"] = info.retry_count if info is not None else 0
        # State written before metrics_url was an output has the log URL it derives from.
        if metrics_url := props.get("metrics_url") or _metrics_url(props.get("log_url")):
            live["metrics_url"] = metrics_url
            live.update(_progress(id_, metrics_url))
        return ReadResult(id_, {**props, **live})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        self._delete(props["endpoint"], id_)

    @staticmethod
    def _delete(endpoint: str, job_id: str) -> None:
        """Terminate the job if tasks may run, delete it, and wait until Batch no longer has it;
        a job that is gone already is fine."""
        from azure.core.exceptions import ResourceNotFoundError

        client = batch.client(endpoint)

        def read() -> str:
            return state_text(
                _call(endpoint, f"read job {job_id}", lambda: client.get_job(job_id)).state
            )

        try:
            state = read()
            if state in RUNNING_STATES:
                poller = _call(
                    endpoint,
                    f"terminate job {job_id}",
                    lambda: client.begin_terminate_job(
                        job_id, terminate_options(), polling_interval=POLL_SECONDS
                    ),
                )
                poll_succeeded(poller, DELETE_WAIT_SECONDS)  # not trusted: read again
                state = read()
            if state != "deleting":
                poller = _call(
                    endpoint,
                    f"delete job {job_id}",
                    lambda: client.begin_delete_job(job_id, polling_interval=POLL_SECONDS),
                )
                poll_succeeded(poller, DELETE_WAIT_SECONDS)  # not trusted: the loop reads
            deadline = time.monotonic() + DELETE_WAIT_SECONDS
            while (state := read()) == "deleting" and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
        except ResourceNotFoundError:
            return
        raise JobError(
            f"job {job_id} at {endpoint} is still {state} after its delete: look at the job "
            "in the portal, then run the operation again"
        )


def _outputs(spec: JobSpec, state: str) -> dict[str, str]:
    return {
        "job_id": spec.job_id,
        "state": state,
        "portal_url": spec.portal_url,
        "log_url": spec.log_url,
        "metrics_url": spec.metrics_url,
        "checkpoint_path": spec.checkpoint_path,
    }


def _metrics_url(log_url: Any) -> str | None:
    return f"{log_url}{LIVE_FOLDER}" if isinstance(log_url, str) and log_url else None


def _progress(job_id: str, metrics_url: str) -> dict[str, Any]:
    """The job's last logged step and images/s, from what its rank 0 uploaded; nothing (and a
    warning when storage refused) if there is none: a refresh never fails on its metrics."""
    from infra.live_metrics import NotUploaded, StorageError, blob_container, latest_step
    from trainer.blob_folder import BlobFolder

    try:
        folder = BlobFolder.parse(metrics_url)
        latest = latest_step(blob_container(folder, timeout=PROGRESS_TIMEOUT_SECONDS), folder)
    except NotUploaded:
        return {}
    except (StorageError, ValueError) as err:
        pulumi.log.warn(f"job {job_id}: no current step: {err}")
        return {}
    if latest is None:
        return {}
    step, rate = latest
    return {"step": step, **({} if rate is None else {"images_per_sec": round(rate, 1)})}


@dataclass(frozen=True)
class TrainingJobArgs:
    stack: str
    endpoint: pulumi.Input[str]
    account_id: pulumi.Input[str]
    pool_id: pulumi.Input[str]
    node_count: int
    vm_size: str
    image_ref: pulumi.Input[str]
    registry_server: pulumi.Input[str]
    node_identity_id: pulumi.Input[str]
    node_identity_client_id: pulumi.Input[str]
    blob_endpoint: pulumi.Input[str]
    trainer_args: tuple[str, ...]
    dataset_prefix: str
    name: str = ""
    priority: int = 0
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
    portal_url: pulumi.Output[str]
    log_url: pulumi.Output[str]
    metrics_url: pulumi.Output[str]
    checkpoint_path: pulumi.Output[str]

    def __init__(
        self, name: str, args: TrainingJobArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props: dict[str, Any] = {f.name: getattr(args, f.name) for f in fields(args)}
        props["endpoint"] = pulumi.Output.concat("https://", args.endpoint)
        props["trainer_args"] = list(args.trainer_args)
        props.update({key: None for key in OUTPUT_KEYS})
        super().__init__(
            TrainingJobProvider(),
            name,
            props,
            pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(delete_before_replace=True)),
        )
