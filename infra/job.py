"""The training job as a stack resource: a Pulumi dynamic resource over ``azure-batch`` 15.x.

Batch jobs are data-plane objects (no ARM resource), so ``TrainingJobProvider`` creates the job
and its multi-instance task with Entra credentials (``DefaultAzureCredential``; the deployer
holds the Batch data-plane roles). Any input change replaces the job (delete before replace:
the new job reuses the pool at once); delete terminates and deletes it; read refreshes its
state. The payloads are built from azure-batch's own model classes by pure functions, so tests
check them without Azure. Azure SDK imports stay inside functions: Pulumi pickles the provider.

On the nodes: every node runs ``trainer.launch`` in the stack's image (host network and IPC,
InfiniBand devices, unlimited locked memory, the VM's NCCL topology files). Checkpoints live on
the NFS share under a folder named by the trainer settings, so a task retry, a replaced job
with new code, or a job after ``pulumi up`` resumes from the newest checkpoint. stdout/stderr
go to the ``logs`` container with the nodes' managed identity when the task ends.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import asdict, dataclass, fields
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, ResourceProvider

from infra.cluster import NFS_RELATIVE_MOUNT
from trainer.jobs import TASK_ID, state_text

MAX_TASK_RETRIES = 3
CONTAINER_RUN_OPTIONS = (
    "--network host --ipc host --gpus all --shm-size 64g "
    "--ulimit memlock=-1 --ulimit stack=67108864 "
    "--device /dev/infiniband --cap-add IPC_LOCK "
    "-v /opt/microsoft:/opt/microsoft:ro"  # NCCL topology files of the Azure HPC image
)
NFS_ROOT = f"${{AZ_BATCH_NODE_MOUNTS_DIR}}/{NFS_RELATIVE_MOUNT}"
DATASET_ROOT = "${AZ_BATCH_NODE_SHARED_DIR}/datasets"  # each node's local disk


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

    @property
    def job_id(self) -> str:
        """Stable for the same inputs, new for any change (Batch ids cannot be reused at once)."""
        payload = json.dumps(asdict(self), sort_keys=True).encode()
        return f"{self.stack}-{hashlib.sha256(payload).hexdigest()[:10]}"[:64]

    @property
    def run_name(self) -> str:
        """Names the checkpoint folder: the same training settings resume the same run."""
        settings = json.dumps([self.trainer_args, self.dataset_prefix]).encode()
        return hashlib.sha256(settings).hexdigest()[:12]

    @property
    def checkpoint_path(self) -> str:
        return f"{NFS_RELATIVE_MOUNT}/runs/{self.stack}/{self.run_name}"

    @property
    def log_url(self) -> str:
        return f"{self.blob_endpoint.rstrip('/')}/logs/{self.job_id}/"

    @property
    def portal_url(self) -> str:
        return f"https://portal.azure.com/#resource{self.account_id}/jobs"

    @classmethod
    def from_props(cls, props: dict[str, Any]) -> JobSpec:
        values = {f.name: props[f.name] for f in fields(cls)}
        values["trainer_args"] = tuple(values["trainer_args"])
        values["node_count"] = int(values["node_count"])
        return cls(**values)


def _shell(*parts: str) -> str:
    """A bash command line: ``${VAR}`` parts in double quotes (expanded), the rest quoted."""
    return " ".join(f'"{p}"' if "${" in p else shlex.quote(p) for p in parts)


def _in_bash(command: str) -> str:
    return f"/bin/bash -c {shlex.quote(command)}"


def _container(spec: JobSpec):
    from azure.batch import models as m

    return m.BatchTaskContainerSettings(
        image_name=spec.image_ref,
        container_run_options=CONTAINER_RUN_OPTIONS,
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


def trainer_command(spec: JobSpec) -> list[str]:
    args = ["python", "-m", "trainer", *spec.trainer_args, "--backend", "horovod"]
    if spec.dataset_prefix:
        args += ["--data", "shards", "--data-dir", f"{DATASET_ROOT}/{spec.dataset_prefix}"]
    return [*args, "--output-dir", f"{NFS_ROOT}/runs/{spec.stack}/{spec.run_name}"]


def job_options(spec: JobSpec):
    """The job: on the stack's pool, ends when its task ends, stages data first if asked."""
    from azure.batch import models as m

    from trainer.data.transfer import stage_args

    preparation = None
    if spec.dataset_prefix:
        dest = f"{DATASET_ROOT}/{spec.dataset_prefix}"
        stage = stage_args(spec.blob_endpoint, "datasets", spec.dataset_prefix, dest)
        preparation = m.BatchJobPreparationTask(
            id="stage-data",
            command_line=_in_bash(_shell(*stage)),
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
        display_name=f"{spec.stack} training",
        pool_info=m.BatchPoolInfo(pool_id=spec.pool_id),
        all_tasks_complete_mode="terminatejob",
        job_preparation_task=preparation,
        metadata=[
            m.BatchMetadataItem(name="stack", value=spec.stack),
            m.BatchMetadataItem(name="run", value=spec.run_name),
        ],
    )


def task_options(spec: JobSpec):
    """The multi-instance task: one instance per node, ``trainer.launch`` on each."""
    from azure.batch import models as m

    launch = ["python", "-m", "trainer.launch", "--vm-size", spec.vm_size, "--"]
    command = _shell(*launch, *trainer_command(spec))
    # Batch runs the application command on the primary only and the coordination command on
    # every node: the other nodes' launchers start there, in the background.
    coordination = (
        'if [ "$AZ_BATCH_IS_CURRENT_NODE_MASTER" != true ]; then '
        f'nohup {command} > "$AZ_BATCH_TASK_WORKING_DIR/launch.log" 2>&1 & fi'
    )
    return m.BatchTaskCreateOptions(
        id=TASK_ID,
        display_name=f"{spec.node_count} x {spec.vm_size}",
        command_line=_in_bash(command),
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


def _client(endpoint: str):
    from azure.batch import BatchClient
    from azure.identity import DefaultAzureCredential

    return BatchClient(endpoint=endpoint, credential=DefaultAzureCredential())


OUTPUT_KEYS = ("job_id", "state", "portal_url", "log_url", "checkpoint_path")


class TrainingJobProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        spec = JobSpec.from_props(props)
        client = _client(spec.endpoint)
        client.create_job(job_options(spec))
        try:
            client.create_task(spec.job_id, task_options(spec))
        except Exception:
            # No job without its task: it would hold the pool and never finish.
            client.begin_delete_job(spec.job_id).result()
            raise
        state = state_text(client.get_job(spec.job_id).state)
        return CreateResult(spec.job_id, {**props, **_outputs(spec, state)})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # ``__provider`` is this class serialized: editing provider code must not resubmit jobs.
        changed = [
            key
            for key in news
            if key not in OUTPUT_KEYS
            and not key.startswith("__")
            and olds.get(key) != news.get(key)
        ]
        return DiffResult(
            changes=bool(changed), replaces=changed, delete_before_replace=bool(changed)
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from azure.core.exceptions import ResourceNotFoundError

        spec = JobSpec.from_props(props)
        try:
            state = state_text(_client(spec.endpoint).get_job(id_).state)
        except ResourceNotFoundError:
            return ReadResult(None, {})  # deleted outside Pulumi: gone from the stack too
        return ReadResult(id_, {**props, "state": state})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        client = _client(JobSpec.from_props(props).endpoint)
        try:
            job = client.get_job(id_)
            if state_text(job.state) not in ("completed", "terminating", "deleting"):
                client.begin_terminate_job(id_).result()
            client.begin_delete_job(id_).result()
        except ResourceNotFoundError:
            return


def _outputs(spec: JobSpec, state: str) -> dict[str, str]:
    return {
        "job_id": spec.job_id,
        "state": state,
        "portal_url": spec.portal_url,
        "log_url": spec.log_url,
        "checkpoint_path": spec.checkpoint_path,
    }


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


class TrainingJob(pulumi.dynamic.Resource):
    job_id: pulumi.Output[str]
    state: pulumi.Output[str]
    portal_url: pulumi.Output[str]
    log_url: pulumi.Output[str]
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
