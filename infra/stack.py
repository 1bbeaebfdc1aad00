"""The whole environment for one stack: components in dependency order, then its outputs.

``declare`` reads as the list of steps; each step hands a component its own section of the
settings (``infra.settings``) and the outputs of the components it depends on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi_azure_native import authorization, resources

from infra import naming
from infra.azureml_command import EXPERIMENT_VARIABLE, AzuremlJobSpec
from infra.azureml_compute import AzuremlCompute, ComputeArgs
from infra.azureml_job import AZUREML_JOB_OUTPUTS, AzuremlJob, AzuremlJobArgs
from infra.budget import CostBudget
from infra.cluster import GpuCluster, GpuClusterArgs
from infra.code_upload import CONTAINER as CODE_CONTAINER
from infra.code_upload import CodeUpload, CodeUploadArgs
from infra.identity import (
    STORAGE_BLOB_DATA_CONTRIBUTOR,
    Identities,
    IdentitiesArgs,
    assign_role,
    container_scope,
    deployer_principal_type,
)
from infra.image import PullSource, ReusedImage, TrainerImage, TrainerImageArgs
from infra.image_inputs import content_tag
from infra.image_source import commit_to_build
from infra.job import TrainingJob, TrainingJobArgs
from infra.job_outputs import JOB_OUTPUTS
from infra.monitoring import Monitoring, MonitoringArgs
from infra.naming import Placement
from infra.network import Network
from infra.nfs import NfsArgs, NfsServer
from infra.registry import Registry, RegistryArgs
from infra.settings.checks import ConfigError
from infra.settings.jobs import SHORTHAND_JOB, JobSettings
from infra.settings.secrets import secret_setting
from infra.settings.stack import StackSettings
from infra.storage import CONTAINERS, OPERATOR_CONTAINERS, BlobReader, Storage, StorageArgs
from infra.trainer_command import trainer_flags
from infra.trainer_settings import job_settings
from infra.workspace import AzuremlWorkspace, WorkspaceArgs


@dataclass(frozen=True)
class Tracking:
    """What a job's tasks get to track their runs, and what must exist before they start."""

    environment: tuple[tuple[str, Any], ...]
    ready: Sequence[pulumi.Resource]


def declare(s: StackSettings) -> dict[str, Any]:
    """Declare every resource of the stack and return the stack outputs (snake_case nouns)."""
    commit = _commit_to_build(s)  # may refuse the source: before any resource exists
    deployer_type = deployer_principal_type()
    _refuse_jobs_only_the_deployer_can_operate(s, deployer_type)
    stem = naming.prefix(team=s.team, stack=s.stack)
    client = authorization.get_client_config_output()
    tags = naming.default_tags(team=s.team, stack=s.stack, cost_center=s.cost_center)
    rg = resources.ResourceGroup(
        stem, resource_group_name=f"rg-{stem}", location=s.location, tags=tags
    )
    at = Placement(rg.name, s.location, tags)

    net = Network(stem, s.network, at)
    store = _storage(stem, at, s, net, client, deployer_type)
    image, pull = _image(stem, at, s, net, client, commit)
    ids = Identities(
        stem,
        IdentitiesArgs(
            placement=at,
            subscription_id=client.subscription_id,
            registry_id=pull.registry_id,
            registry_pull_role=pull.pull_role,
            storage_account_id=store.account_id,
            blob_containers=store.containers,
        ),
    )
    workspace = _workspace(stem, at, s, rg, net, ids, store, pull, client)
    if s.budget.amount:
        CostBudget(stem, s.budget, rg.id)
    outputs = {
        "resource_group_name": rg.name,
        "storage_account_name": store.account_name,
        "storage_containers": list(CONTAINERS),
        "registry_login_server": pull.login_server,
        "node_count": s.cluster.node_count,
        "vm_size": s.cluster.vm_size,
        **_workspace_outputs(workspace),
    }
    if workspace is not None and s.azureml.on_azureml:
        aml = _azureml_backend(
            stem, at, s, net, ids, image, store, workspace, client, deployer_type
        )
        return {**aml, **outputs}
    nfs = _nfs(stem, at, s, net)
    cluster = _cluster(stem, at, s, net, ids, store, pull, nfs, client, deployer_type)
    _monitoring(stem, at, s, store, workspace=workspace, cluster=cluster, nfs=nfs)
    uploads = _code_uploads(stem, s, store, client, deployer_type)
    tracking = _tracking(s, workspace)
    jobs = {
        job.name: _job(stem, s, job, cluster, image, pull, ids, store, uploads, tracking)
        for job in s.jobs
    }
    return {
        **_job_outputs(image, jobs),
        **outputs,
        **_batch_outputs(nfs, cluster),
    }


def _azureml_backend(
    stem: str,
    at: Placement,
    s: StackSettings,
    net: Network,
    ids: Identities,
    image: TrainerImage | ReusedImage,
    store: Storage,
    workspace: AzuremlWorkspace,
    client: pulumi.Output[Any],
    deployer_type: str,
) -> dict[str, Any]:
    """The AzureML backend's compute, its monitoring and the stack's jobs there; its outputs."""
    compute = _azureml_compute(stem, at, s, net, ids, image, workspace, client)
    _monitoring(stem, at, s, store, workspace=workspace)
    uploads = _code_uploads(stem, s, store, client, deployer_type)
    on = AzuremlOn(compute, image, ids, store, workspace, client, uploads)
    jobs = {job.name: _azureml_job(stem, at, s, job, on) for job in s.jobs}
    return {**_job_outputs(image, jobs), **_azureml_outputs(compute, image)}


def _batch_outputs(nfs: NfsServer, cluster: GpuCluster) -> dict[str, Any]:
    """Where the Batch backend's shared files and pool are."""
    return {
        "nfs_address": nfs.address,
        "nfs_export_path": nfs.export_path,
        "batch_account_endpoint": cluster.account_endpoint,
        "pool_id": cluster.pool_id,
    }


def _monitoring(
    stem: str,
    at: Placement,
    s: StackSettings,
    store: Storage,
    *,
    workspace: AzuremlWorkspace | None,
    cluster: GpuCluster | None = None,
    nfs: NfsServer | None = None,
) -> Monitoring:
    """Logs and metrics of what the stack runs on: the Batch account and the NFS server, or the
    AzureML workspace (its compute's events), and the data account."""
    return Monitoring(
        stem,
        MonitoringArgs(
            placement=at,
            retention_days=s.log_retention_days,
            batch_account_id=cluster.account_id if cluster else None,
            storage_account_id=store.account_id,
            nfs_vm_id=nfs.vm_id if nfs else None,
            azureml_workspace_id=workspace.workspace_id if workspace else None,
        ),
    )


def _azureml_compute(
    stem: str,
    at: Placement,
    s: StackSettings,
    net: Network,
    ids: Identities,
    image: TrainerImage | ReusedImage,
    workspace: AzuremlWorkspace,
    client: pulumi.Output[Any],
) -> AzuremlCompute:
    """The AzureML backend's cluster of the pool's size in the compute subnet, with the nodes'
    identity, and the trainer image as its environment; the team submits jobs there."""
    c = s.cluster
    team = (c.job_submitter_object_id, c.job_submitter_type) if c.job_submitter_object_id else None
    return AzuremlCompute(
        stem,
        ComputeArgs(
            placement=at,
            workspace_name=workspace.workspace_name,
            workspace_id=workspace.workspace_id,
            subscription_id=client.subscription_id,
            team=team,
            compute_name=naming.compute_name(team=s.team, stack=s.stack),
            vm_size=c.vm_size,
            node_count=c.node_count,
            spot=c.spot,
            min_nodes=c.node_count if c.scale_mode == "fixed" else 0,
            idle_minutes=c.idle_minutes,
            subnet_id=net.compute_subnet_id,
            node_identity_id=ids.nodes.id,
            image_ref=image.ref,
            after=[*ids.assignments, *workspace.ready],
        ),
    )


def _azureml_outputs(compute: AzuremlCompute, image: TrainerImage | ReusedImage) -> dict[str, Any]:
    """Where the AzureML backend runs jobs: its compute and the trainer's environment."""
    return {
        "image_ref": image.ref,
        "image_digest": image.digest,
        "azureml_compute_name": compute.compute_name,
        "azureml_environment_id": compute.environment_id,
    }


@dataclass(frozen=True)
class AzuremlOn:
    """What the stack's AzureML jobs run on and with."""

    compute: AzuremlCompute
    image: TrainerImage | ReusedImage
    ids: Identities
    store: Storage
    workspace: AzuremlWorkspace
    client: pulumi.Output[Any]
    uploads: dict[str, CodeUpload]


def _azureml_job(
    stem: str, at: Placement, s: StackSettings, job: JobSettings, on: AzuremlOn
) -> dict[str, Any]:
    """One job of the stack as an AzureML command (or sweep) job on the stack's compute; its
    outputs."""
    shorthand = job.name == SHORTHAND_JOB
    resource = AzuremlJob(
        f"{stem}-job" if shorthand else f"{stem}-job-{job.name}",
        AzuremlJobArgs(
            placement=at,
            workspace_name=on.workspace.workspace_name,
            workspace_id=on.workspace.workspace_id,
            tenant_id=on.client.tenant_id,
            compute_id=on.compute.compute_id,
            environment_id=on.compute.environment_id,
            node_identity_id=on.ids.nodes.id,
            spec=pulumi.Output.all(
                on.image.ref, on.ids.nodes.client_id, on.store.blob_endpoint
            ).apply(lambda known: _azureml_spec(s, job, *known)),
            label=job.name,
            protect_running=s.protect_running_jobs and job.name not in s.replace_jobs,
            # The nodes fetch the job's code as soon as it starts.
            after=[on.compute, *([on.uploads[job.code.sha256]] if job.code else [])],
            sweep=job.sweep,
        ),
    )
    outputs = {name: getattr(resource, attr) for name, attr in AZUREML_JOB_OUTPUTS.items()}
    if job.sweep is not None:  # what `dt-jobs trials` shows of it
        outputs["sweep"] = job.sweep.outputs()
    return {**outputs, "node_count": job.nodes}


def _azureml_spec(
    s: StackSettings, job: JobSettings, image_ref: str, client_id: str, blob_endpoint: str
) -> AzuremlJobSpec:
    """The job's fields on AzureML, once its image, the nodes' identity and storage are known;
    a sweep's trials give its swept settings their samples, so the file's own are left out."""
    trainer = job_settings(job.trainer, job.dataset_prefix) if job.trainer else ()
    if job.sweep is not None:
        trainer = tuple(pair for pair in trainer if pair[0] not in job.sweep.swept)
    return AzuremlJobSpec(
        stack=s.stack,
        endpoint="",
        account_id="",
        pool_id="",
        node_count=job.nodes,
        vm_size=s.cluster.vm_size,
        image_ref=image_ref,
        registry_server="",
        node_identity_id="",
        node_identity_client_id=client_id,
        blob_endpoint=blob_endpoint,
        trainer_args=trainer_flags(trainer),
        dataset_prefix=job.dataset_prefix,
        name="" if job.name == SHORTHAND_JOB else job.name,
        command=job.command,
        engine=job.engine,
        code_sha256=job.code.sha256 if job.code else "",
        max_wall_clock_hours=job.max_wall_clock_hours,
        tracking=((EXPERIMENT_VARIABLE, s.tracking.experiment or s.stack),),
        trainer_settings=trainer,
        sweep=job.sweep.identity() if job.sweep else "",
    )


def _workspace(
    stem: str,
    at: Placement,
    s: StackSettings,
    rg: resources.ResourceGroup,
    net: Network,
    ids: Identities,
    store: Storage,
    pull: PullSource,
    client: pulumi.Output[Any],
) -> AzuremlWorkspace | None:
    """The ``azureml`` section's workspace, on the stack's storage and (unless an imageRef
    comes from elsewhere) its registry, reached from the compute subnet."""
    if not s.azureml.declares_workspace:
        return None
    return AzuremlWorkspace(
        stem,
        WorkspaceArgs(
            placement=at,
            workspace_name=naming.workspace_name(stem),
            vault_name=naming.global_name(team=s.team, stack=s.stack, role="kv"),
            tenant_id=client.tenant_id,
            subscription_id=client.subscription_id,
            resource_group_id=rg.id,
            storage_account_id=store.account_id,
            registry_id=None if s.image.ref else pull.registry_id,
            vnet_id=net.vnet_id,
            endpoint_subnet_id=net.compute_subnet_id,
            nodes_principal_id=ids.nodes.principal_id,
            protect_data=s.protect_data,
        ),
    )


def _tracking(s: StackSettings, workspace: AzuremlWorkspace | None) -> Tracking:
    """Where the jobs track their runs: the stack's server, else its workspace (once the nodes
    may write there and find it), else nowhere."""
    if workspace is None:
        return Tracking(s.tracking.environment(s.stack), ())
    return Tracking(s.tracking.environment(s.stack, workspace.tracking_uri), workspace.ready)


def _workspace_outputs(workspace: AzuremlWorkspace | None) -> dict[str, Any]:
    """Where the workspace's runs are tracked and seen (none without one)."""
    if workspace is None:
        return {}
    return {
        "azureml_workspace_name": workspace.workspace_name,
        "azureml_workspace_id": workspace.workspace_id,
        "azureml_tracking_uri": workspace.tracking_uri,
        "azureml_studio_url": workspace.studio_url,
    }


def _nfs(stem: str, at: Placement, s: StackSettings, net: Network) -> NfsServer:
    """The ``nfs`` section, served from ``net``'s storage subnet to its compute subnet."""
    return NfsServer(
        stem,
        s.nfs,
        NfsArgs(
            placement=at,
            network=s.network,
            storage_subnet_id=net.storage_subnet_id,
            compute_subnet_id=net.compute_subnet_id,
            files_account_name=naming.global_name(team=s.team, stack=s.stack, role="nfs"),
            protect_data=s.protect_data,
        ),
    )


def _commit_to_build(s: StackSettings) -> str:
    """The commit the acr builder builds ("" for docker or an imageRef); a real `pulumi up`
    refuses uncommitted image inputs and a commit the remote lacks
    (infra.image_source.commit_to_build)."""
    return commit_to_build() if s.image.builder == "acr" and not s.image.ref else ""


def _image(
    stem: str,
    at: Placement,
    s: StackSettings,
    net: Network,
    client: pulumi.Output[Any],
    commit: str,
) -> tuple[TrainerImage | ReusedImage, PullSource]:
    """The trainer image and where the nodes pull it: ``imageRef`` as given (no build, no
    registry of the stack's), or a build pushed to the stack's own registry."""
    if s.image.ref:
        reused = ReusedImage(stem, s.image)
        return reused, reused.source
    registry = Registry(
        stem,
        RegistryArgs(
            placement=at,
            registry_name=naming.global_name(team=s.team, stack=s.stack, role="acr", max_length=50),
            # The nodes reach the registry from the NAT gateway's address.
            allowed_ips=[net.nat_public_ip, *s.network.registry_allowed_ips],
        ),
    )
    image = TrainerImage(
        stem,
        s.image,
        TrainerImageArgs.pushing_to(
            registry,
            placement=at,
            subscription_id=client.subscription_id,
            tag=content_tag(),
            commit=commit,
            source_token=secret_setting("imageSourceToken"),
        ),
    )
    return image, PullSource.of(registry, image)


def _storage(
    stem: str,
    at: Placement,
    s: StackSettings,
    net: Network,
    client: pulumi.Output[Any],
    deployer_type: str,
) -> Storage:
    return Storage(
        stem,
        StorageArgs(
            placement=at,
            account_name=naming.global_name(team=s.team, stack=s.stack, role="data"),
            subnet_ids=[net.compute_subnet_id, net.storage_subnet_id],
            allowed_ips=s.network.storage_allowed_ips,
            protect_data=s.protect_data,
            blob_version_days=s.blob_version_days,
            checkpoint_version_days=s.checkpoint_version_days,
            readers=_blob_readers(s, client, deployer_type),
            subscription_id=client.subscription_id,
        ),
    )


def _blob_readers(
    s: StackSettings, client: pulumi.Output[Any], deployer_type: str
) -> list[BlobReader]:
    """The operators read what their commands show (``OPERATOR_CONTAINERS``): the deployer
    and the team's group, the same principals as Job Submitter. An acceptance stack's check
    reads the job's logs as the deployer, from the whole account."""
    if s.acceptance_profile:
        return [BlobReader("deployer", client.object_id, deployer_type)]
    readers = [BlobReader("deployer", client.object_id, deployer_type, OPERATOR_CONTAINERS)]
    cluster = s.cluster
    if cluster.job_submitter_object_id:
        readers.append(
            BlobReader(
                "team",
                cluster.job_submitter_object_id,
                cluster.job_submitter_type,
                OPERATOR_CONTAINERS,
            )
        )
    return readers


def _refuse_jobs_only_the_deployer_can_operate(s: StackSettings, deployer_type: str) -> None:
    """Job Submitter goes to whoever runs `pulumi up` and to the team's principal. When CI (a
    service principal) deploys a stack's jobs and no team principal is named, no person can
    read, follow or cancel them, and a colleague's preview cannot refresh them."""
    if s.jobs and deployer_type == "ServicePrincipal" and not s.cluster.job_submitter_object_id:
        raise ConfigError(
            "jobSubmitterObjectId is empty while a service principal (CI) deploys this stack's "
            "jobs, so only CI could operate them: set it to the team's Entra group object id "
            "(jobSubmitterType Group)"
        )


def _cluster(
    stem: str,
    at: Placement,
    s: StackSettings,
    net: Network,
    ids: Identities,
    store: Storage,
    pull: PullSource,
    nfs: NfsServer,
    client: pulumi.Output[Any],
    deployer_type: str,
) -> GpuCluster:
    return GpuCluster(
        stem,
        s.cluster,
        GpuClusterArgs(
            placement=at,
            account_name=naming.global_name(team=s.team, stack=s.stack, role="batch"),
            subnet_id=net.compute_subnet_id,
            node_identity_id=ids.nodes.id,
            storage_account_id=store.account_id,
            registry_server=pull.login_server,
            prefetch_image=pull.prefetch,
            nfs_source=nfs.source,
            nfs_mount_options=nfs.mount_options,
            deployer_object_id=client.object_id,
            deployer_type=deployer_type,
            subscription_id=client.subscription_id,
            acceptance_profile=s.acceptance_profile,
            # Nodes pull images and write blobs as soon as they boot: grant the roles first, and
            # push the image they prefetch (a node whose prefetch fails is unusable).
            pool_after=[*ids.assignments, *([pull.pushed_by] if pull.pushed_by else [])],
        ),
    )


def _code_uploads(
    stem: str, s: StackSettings, store: Storage, client: pulumi.Output[Any], deployer_type: str
) -> dict[str, CodeUpload]:
    """One upload per snapshot hash the stack's jobs name (equal code is one blob), written
    with the deployer's own data role on the code container, granted only to a stack with
    code jobs (Owner or Contributor reach no blob data: azure-docs articles/storage/blobs/
    authorize-access-azure-active-directory.md, read 2026-11-28)."""
    folders: dict[str, str] = {}
    for job in s.jobs:
        if job.code is not None:
            folders.setdefault(job.code.sha256, job.code.folder)
    if not folders:
        return {}
    writer = assign_role(
        f"{stem}-deployer-code",
        role=STORAGE_BLOB_DATA_CONTRIBUTOR,
        principal_id=client.object_id,
        scope=container_scope(store.account_id, CODE_CONTAINER),
        subscription_id=client.subscription_id,
        principal_type=authorization.PrincipalType(deployer_type),
        parent=store,
        depends_on=[store.containers[CODE_CONTAINER]],
    )
    return {
        sha256: CodeUpload(
            f"{stem}-code-{sha256[:12]}",
            CodeUploadArgs(folder, sha256, store.blob_endpoint),
            opts=pulumi.ResourceOptions(depends_on=[store, writer]),
        )
        for sha256, folder in folders.items()
    }


def _job(
    stem: str,
    s: StackSettings,
    job: JobSettings,
    cluster: GpuCluster,
    image: TrainerImage | ReusedImage,
    pull: PullSource,
    ids: Identities,
    store: Storage,
    uploads: dict[str, CodeUpload],
    tracking: Tracking,
) -> dict[str, Any]:
    """Submit one job of the stack (tracking its runs where ``tracking`` says); its outputs."""
    shorthand = job.name == SHORTHAND_JOB
    trainer = job_settings(job.trainer, job.dataset_prefix) if job.trainer else ()
    resource = TrainingJob(
        # The shorthand's job keeps the name (and so the URN) it had before the jobs map.
        f"{stem}-job" if shorthand else f"{stem}-job-{job.name}",
        TrainingJobArgs(
            stack=s.stack,
            endpoint=cluster.account_endpoint,
            account_id=cluster.account_id,
            pool_id=cluster.pool_id,
            node_count=job.nodes,
            vm_size=s.cluster.vm_size,
            image_ref=image.ref,
            registry_server=pull.login_server,
            node_identity_id=ids.nodes.id,
            node_identity_client_id=ids.nodes.client_id,
            blob_endpoint=store.blob_endpoint,
            trainer_args=trainer_flags(trainer),
            dataset_prefix=job.dataset_prefix,
            name="" if shorthand else job.name,
            priority=job.priority,
            command=job.command,
            engine=job.engine,
            code_sha256=job.code.sha256 if job.code else "",
            max_wall_clock_hours=job.max_wall_clock_hours,
            tracking=tracking.environment,
            trainer_settings=trainer,
            protect_running=s.protect_running_jobs and job.name not in s.replace_jobs,
        ),
        # Data-plane calls need the deployer's Batch roles to exist first; the nodes fetch
        # the job's code as soon as it starts.
        opts=pulumi.ResourceOptions(
            depends_on=[
                cluster,
                *([uploads[job.code.sha256]] if job.code else []),
                *tracking.ready,
            ]
        ),
    )
    return _job_outputs_of(resource, job.nodes)


def _job_outputs_of(resource: TrainingJob, nodes: int) -> dict[str, Any]:
    """One job's stack outputs (``infra.job_outputs.JOB_OUTPUTS``): its ids and links, its live
    state and progress, its node count."""
    return {
        name: nodes if output is None else getattr(resource, output)
        for name, output in JOB_OUTPUTS.items()
    }


def _job_outputs(
    image: TrainerImage | ReusedImage, jobs: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The image's outputs, the jobs' under ``jobs``, and the one job's outputs at the top
    level too when there is one (the shorthand's outputs)."""
    outputs: dict[str, Any] = {"image_ref": image.ref, "image_digest": image.digest}
    if jobs:
        outputs["jobs"] = jobs
    if len(jobs) == 1:
        (only,) = jobs.values()
        outputs.update({k: v for k, v in only.items() if k.startswith("job_")})
    return outputs
