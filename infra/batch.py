"""The Batch contract: what the job resource (infra/job.py) sends Batch and the operator CLI
(dt_commands/jobs/) reads back. The task's id, how Batch spells states, the one client factory
with the one endpoint convention, the calls azure-batch 15.1 gets wrong, and the pure payload
builders: a job's spec (``infra.job_spec.JobSpec``) -> the job and its multi-instance task, built
from azure-batch's own model classes, so tests check them without Azure.

Azure SDK imports stay inside functions: the job resource's provider host imports this module
for every operation, and Pulumi pickles the provider by reference.
"""

from __future__ import annotations

import functools
import re
import shlex
import time
from collections.abc import Callable
from typing import Any

from infra import credentials
from infra.job_spec import NFS_RELATIVE_MOUNT, JobSpec, wall_clock_limit
from infra.node_scripts import in_bash
from infra.sizes import size_of
from infra.trainer_command import JobSet, commands, script_commands, stage_data_command

TASK_ID = "train"  # the multi-instance task in every job
# Batch's own default reason; also what makes the terminate request sendable (terminate_options).
TERMINATE_REASON = "UserTerminate"
# Job states in which tasks may still run: terminate before delete so the launchers get SIGTERM
# and checkpoint (a delete removes the task data at once).
RUNNING_STATES = ("active", "disabling", "disabled", "enabling")
# Counts real failures only: after an eviction or maintenance notice the launcher waits for the
# platform to take the VM, and Batch's recovery retries the task without counting it
# (trainer/launch/eviction.py, HOLD_SECONDS).
MAX_TASK_RETRIES = 3
# No --gpus: Batch enables the GPUs for container tasks on GPU pools itself and documents not
# passing it (articles/batch/batch-docker-container-workloads.md).
# /dev/shm for the data loaders' workers and NCCL: an InfiniBand size's, a CPU size's (the
# AzureML backend's job gives its container the same: infra.azureml_command.shm_size).
SHM_SIZE, CPU_SHM_SIZE = "64g", "2g"
CONTAINER_RUN_OPTIONS = (
    f"--network host --ipc host --shm-size {SHM_SIZE} "
    "--ulimit memlock=-1 --ulimit stack=67108864 "
    "--device /dev/infiniband --cap-add IPC_LOCK "
    "-v /opt/microsoft:/opt/microsoft:ro"  # NCCL topology files of the Azure HPC image
)
# A size without InfiniBand (the CPU acceptance size) has no /dev/infiniband, and docker refuses
# to create a container whose --device path is missing ("error gathering device information
# while adding custom device ...: no such file or directory", moby/moby #41280); nor has it the
# ND sizes' topology files. Host networking stays: the launchers meet on the nodes' addresses.
CPU_CONTAINER_RUN_OPTIONS = (
    f"--network host --ipc host --shm-size {CPU_SHM_SIZE} "
    "--ulimit memlock=-1 --ulimit stack=67108864"
)
NFS_ROOT = f"${{AZ_BATCH_NODE_MOUNTS_DIR}}/{NFS_RELATIVE_MOUNT}"
# Where a job's dataset is staged on each node of a size without local NVMe disks (NVME_ROOT
# below on one): the job preparation task's working directory,
# on the node's local disk, named by the two variables Batch sets for it
# (batch-compute-node-environment-variables.md): AZ_BATCH_TASK_WORKING_DIR in the preparation
# task itself, AZ_BATCH_JOB_PREP_WORKING_DIR in the job's other tasks. Each container mounts
# that folder by a bind mount Batch documents without ambiguity ("Task", "the task path", in
# the preparation's; "JobPrep", "the job-prep task path", in the task's; ContainerHostDataPath,
# Batch REST). Not the node's shared folder: the "Shared" mount is only "the path for
# multi-instances task to shared their files", which may be the task's folder, not
# AZ_BATCH_NODE_SHARED_DIR (docs/fake-readings.md). The folder goes with the job.
STAGE_ROOT = "${AZ_BATCH_TASK_WORKING_DIR}/datasets"
DATASET_ROOT = "${AZ_BATCH_JOB_PREP_WORKING_DIR}/datasets"
# A job's code snapshot (jobs.<name>.code): the preparation task makes it ready in a per-hash
# folder of the node (trainer.launch.code_folder: the node's shared folder when the container sees
# it, which outlives jobs; else the preparation's own folder) and links it here, in its
# working directory; the job's task finds the link under the JobPrep mount.
CODE_LINK = "${AZ_BATCH_TASK_WORKING_DIR}/code"
CODE_DIR = "${AZ_BATCH_JOB_PREP_WORKING_DIR}/code"
# On a size with local NVMe disks (infra.sizes nvme_disks) the pool's start task assembles them
# into one RAID0 array and mounts it here (infra/node_checks.py), where the HPC image's own
# nvme-raid unit would (Azure/azhpc-images customizations/setup_nvme.sh, read 2026-11-28:
# /dev/md128, XFS, /mnt/resource_nvme; written but never enabled on the ND images). Datasets
# are staged under NVME_ROOT/datasets/<prefix> and code snapshots kept under NVME_ROOT/code,
# for every job on the node: staging is a sync (trainer.data.transfer.stage), so the next job
# of the same dataset copies nothing. Containers see only Batch's own folders and what the run
# options bind, so the job's containers bind the mount point there (container_run_options).
NVME_ROOT = "/mnt/resource_nvme"
NVME_DEVICE = "/dev/md128"


def endpoint_url(endpoint: str) -> str:
    """The one endpoint convention: ``https://<account>.<region>.batch.azure.com``, from the
    account's endpoint as ARM reports it (no scheme) or a URL already."""
    return endpoint if endpoint.startswith("https://") else f"https://{endpoint}"


@functools.cache
def client(endpoint: str) -> Any:
    """One client per Batch account, so its pipeline reuses the token it acquired."""
    from infra.azure_sdk import BatchClient

    return BatchClient(endpoint=endpoint_url(endpoint), credential=credentials.credential())


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
    from infra.azure_sdk import BatchJobTerminateOptions

    return BatchJobTerminateOptions(termination_reason=TERMINATE_REASON)


def poll_succeeded(poller: Any, timeout: float | None = None) -> bool:
    """Wait for an azure-batch poller (at most ``timeout`` seconds). False when its polling
    failed: the SDK's job pollers catch any ``AzureError`` while reading the job, set the
    status to ``Failed`` and let ``result()`` return as if all went well
    (azure/batch/_operations/_polling.py)."""
    poller.result(timeout)
    return poller.status() != "Failed"


def terminate_job(batch: Any, job_id: str, poll_seconds: float = 5) -> None:
    """Terminate the job and wait until it is no longer terminating; raises what Batch said.
    A terminate under way already (409 JobBeingTerminated: an earlier cancel's, or a delete's)
    is this one's work in progress: wait for it as the SDK's own poller would."""
    from trainer.common.azure_sdk import HttpResponseError

    try:
        poller = batch.begin_terminate_job(
            job_id, terminate_options(), polling_interval=poll_seconds
        )
    except HttpResponseError as err:
        if error_code(err) != "JobBeingTerminated":
            raise
        wait_while(lambda: state_text(batch.get_job(job_id).state), "terminating", poll_seconds)
        return
    if not poll_succeeded(poller):
        batch.get_job(job_id)  # the poller swallowed an error: read once more to raise it


def error_code(err: Any) -> str:
    """Batch's error code (``JobExists``) of an azure-core error; "" when it carries none."""
    model = getattr(err, "model", None) or getattr(err, "error", None)
    return str(getattr(model, "code", None) or "")


def wait_while(read: Callable[[], str], state: str, poll_seconds: float, limit: float = 900.0):
    """Call ``read`` (a job's state) every ``poll_seconds`` while it says ``state``, for at most
    ``limit`` seconds; the last state read, or None once Batch no longer has the job."""
    from trainer.common.azure_sdk import ResourceNotFoundError

    deadline = time.monotonic() + limit
    while True:
        try:
            now = read()
        except ResourceNotFoundError:
            return None
        if now != state or time.monotonic() >= deadline:
            return now
        time.sleep(poll_seconds)


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


def has_nvme(vm_size: str) -> bool:
    """Whether the size's nodes stage on the local NVMe array (NVME_ROOT); a size this version
    does not know (an older stack's) stages on the temporary disk, as before."""
    try:
        return size_of(vm_size).nvme_disks > 0
    except KeyError:
        return False


def container_run_options(vm_size: str) -> str:
    """The InfiniBand options on an IB size, none of them on a size without InfiniBand ports,
    and the NVMe array's mount point on a size that has one. A size this version does not know
    (an older stack's) keeps the InfiniBand options."""
    try:
        ib_ports = size_of(vm_size).ib_ports
    except KeyError:
        return CONTAINER_RUN_OPTIONS
    options = CONTAINER_RUN_OPTIONS if ib_ports else CPU_CONTAINER_RUN_OPTIONS
    return f"{options} -v {NVME_ROOT}:{NVME_ROOT}" if has_nvme(vm_size) else options


def dataset_folder(spec: JobSpec, *, in_preparation: bool) -> str:
    """Where the job's dataset is staged on each node: the NVMe array's datasets folder, or the
    preparation task's working folder as the preparation itself (STAGE_ROOT) or the job's task
    (DATASET_ROOT) names it."""
    if has_nvme(spec.vm_size):
        return f"{NVME_ROOT}/datasets/{spec.dataset_prefix}"
    return f"{STAGE_ROOT if in_preparation else DATASET_ROOT}/{spec.dataset_prefix}"


def _container(spec: JobSpec):
    from infra.azure_sdk import batch_models as m

    return m.BatchTaskContainerSettings(
        image_name=spec.image_ref,
        container_run_options=container_run_options(spec.vm_size),
        registry=m.ContainerRegistryReference(
            registry_server=spec.registry_server,
            identity_reference=m.BatchNodeIdentityReference(resource_id=spec.node_identity_id),
        ),
        # No "Shared" but for a job with code: its snapshots may be kept in the node's shared
        # folder (see CODE_LINK); the dataset never is (see STAGE_ROOT).
        container_host_batch_bind_mounts=[
            m.ContainerHostBatchBindMountEntry(source=source, is_read_only=False)
            for source in (
                "Task",
                "VfsMounts",
                "JobPrep",
                *(("Shared",) if spec.code_sha256 else ()),
            )
        ],
    )


def _identity_env(spec: JobSpec):
    from infra.azure_sdk import batch_models as m

    # DefaultAzureCredential on the node picks the pool's user-assigned identity by client id.
    return [m.EnvironmentSetting(name="AZURE_CLIENT_ID", value=spec.node_identity_client_id)]


def _training_env(spec: JobSpec):
    """The training task's environment: the identity's, and the MLflow server its rank 0
    tracks the run in (the stack's tracking section), which the launcher's workers inherit."""
    from infra.azure_sdk import batch_models as m

    tracking = [m.EnvironmentSetting(name=name, value=value) for name, value in spec.tracking]
    return [*_identity_env(spec), *tracking]


def job_set(spec: JobSpec) -> JobSet:
    """The values of the trainer settings the job sets itself (``infra.trainer_command``): the
    run folder on NFS, where rank 0 copies its live metrics (the logs container, read from
    outside the private network by `dt-jobs metrics|tensorboard`) and uploads the finished
    run's results (the outputs container, `dt-jobs fetch`), the staged data, the VM size."""
    return JobSet(
        run_dir=f"{NFS_ROOT}/runs/{spec.stack}/{spec.run_name}",
        metrics_upload_url=spec.metrics_url,
        outputs_url=spec.outputs_url,
        vm_size=spec.vm_size,
        checkpoint_mirror_url=spec.checkpoint_mirror_url,
        dataset_dir=dataset_folder(spec, in_preparation=False) if spec.dataset_prefix else "",
    )


def worker_commands(spec: JobSpec) -> tuple[list[str], list[str]]:
    """(the workers' command, the launcher's flags): the trainer's, or the job's own command's
    (``infra.trainer_command``)."""
    if spec.command:
        return script_commands(spec.command, spec.engine, job_set(spec))
    if not spec.settings_render_flags:
        # Its commands cannot be told from its flags without reading them back.
        raise ValueError(
            f"job {spec.job_id}: its trainer_settings do not render its trainer_args; run "
            "`pulumi up` with this version"
        )
    return commands(spec.trainer_settings, job_set(spec))


def trainer_command(spec: JobSpec) -> list[str]:
    """The workers' complete command line (the trainer's, or the job's own), as the launcher
    runs it on every node: what runs follows from the job's inputs alone, and the launcher edits
    nothing. The trainer's command is not part of the job id or the run name (those hash the
    ``JobSpec``), so a change to its rendering replaces no job by itself."""
    return worker_commands(spec)[0]


def stage_command(spec: JobSpec) -> list[str]:
    """``dt-data stage`` for the job's dataset, into the preparation task's folder."""
    folder = dataset_folder(spec, in_preparation=True)
    return stage_data_command(spec.blob_endpoint, spec.dataset_prefix, folder)


def code_command(spec: JobSpec) -> list[str]:
    """``trainer.launch.code_folder``: the job's code snapshot ready on the node, linked at
    CODE_LINK; kept on the NVMe array where the size has one."""
    cache = ["--cache-root", f"{NVME_ROOT}/code"] if has_nvme(spec.vm_size) else []
    return [
        "python",
        "-m",
        "trainer.launch.code_folder",
        "--account-url",
        spec.blob_endpoint,
        "--sha256",
        spec.code_sha256,
        "--link",
        CODE_LINK,
        *cache,
    ]


def preparation_command(spec: JobSpec) -> str:
    """The preparation task's command line: the code first (its failure is the task's, with
    pip's own line), then the dataset; "" when the job needs neither."""
    steps = [code_command(spec)] if spec.code_sha256 else []
    steps += [stage_command(spec)] if spec.dataset_prefix else []
    if not steps:
        return ""
    # Each step must succeed before the next; the last one is exec'd (see task_options).
    return in_bash(*(_shell(*step) for step in steps), exec_last=True)


def job_options(spec: JobSpec):
    """The job: on the stack's pool, stages data first if asked. Created with ``noaction``:
    Batch counts a job without tasks as complete, so ``terminatejob`` is set only once the task
    exists (see ``TrainingJobProvider.create``)."""
    from infra.azure_sdk import batch_models as m

    preparation = None
    if spec.dataset_prefix or spec.code_sha256:
        preparation = m.BatchJobPreparationTask(
            # The id the staging-only preparation has always had.
            id="stage-data" if spec.dataset_prefix else "prepare-code",
            command_line=preparation_command(spec),
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
        constraints=wall_clock_limit(spec.max_wall_clock_hours),
        all_tasks_complete_mode="noaction",
        job_preparation_task=preparation,
        metadata=[
            m.BatchMetadataItem(name="stack", value=spec.stack),
            m.BatchMetadataItem(name="run", value=spec.run_name),
        ],
    )


def launch_command(spec: JobSpec, *mode: str) -> list[str]:
    """``trainer.launch`` in ``mode`` (``--defer-exit-code`` or ``--report``) over the trainer,
    told the engine and the run folder by the same mapping the trainer's command comes from."""
    trainer, given = worker_commands(spec)
    code = ["--code-dir", CODE_DIR] if spec.code_sha256 else []
    launch = ["python", "-m", "trainer.launch", "--vm-size", spec.vm_size, *given, *code, *mode]
    launch.append("--")
    return [*launch, *trainer]


def task_options(spec: JobSpec):
    """The multi-instance task: one instance per node, ``trainer.launch`` on each."""
    from infra.azure_sdk import batch_models as m

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
    # Batch runs a task's command line without a shell, as the container's CMD after the image's
    # ENTRYPOINT (MicrosoftDocs/azure-docs #94943; the trainer image has none), so bash expands
    # the Batch variables; exec'd, the launcher is the container's first process and receives
    # the SIGTERM of a terminate itself.
    return m.BatchTaskCreateOptions(
        id=TASK_ID,
        display_name=f"{spec.node_count} x {spec.vm_size}",
        command_line=in_bash(application, exec_last=True),
        container_settings=_container(spec),
        environment_settings=_training_env(spec),
        multi_instance_settings=m.MultiInstanceSettings(
            number_of_instances=spec.node_count,
            coordination_command_line=in_bash(coordination, exec_last=True),
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
