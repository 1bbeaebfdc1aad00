"""The whole environment for one stack: components in dependency order, then its outputs."""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi_azure_native import authorization, resources

from infra import naming
from infra.budget import BudgetArgs, CostBudget
from infra.cluster import GpuCluster, GpuClusterArgs
from infra.config import SHORTHAND_JOB, StackSettings, secret_setting
from infra.identity import Identities, IdentitiesArgs, deployer_principal_type
from infra.image import TrainerImage, TrainerImageArgs, commit_to_build
from infra.image_inputs import content_tag
from infra.job import TrainingJob, TrainingJobArgs
from infra.monitoring import Monitoring, MonitoringArgs
from infra.network import Network, NetworkArgs
from infra.nfs import NfsArgs, NfsServer
from infra.registry import Registry, RegistryArgs
from infra.storage import CONTAINERS, BlobReader, Storage, StorageArgs
from infra.toolchain import base_reference
from trainer.cli import to_flags


def declare(s: StackSettings) -> dict[str, Any]:
    """Declare every resource of the stack and return the stack outputs (snake_case nouns)."""
    commit = _commit_to_build(s)  # may refuse the source: before any resource exists
    stem, client = naming.prefix(s), authorization.get_client_config_output()
    rg = resources.ResourceGroup(
        stem, resource_group_name=f"rg-{stem}", location=s.location, tags=naming.default_tags(s)
    )
    at = naming.Placement(rg.name, s.location, naming.default_tags(s))

    net = Network(
        stem,
        NetworkArgs(
            placement=at,
            vnet_cidr=s.vnet_cidr,
            compute_subnet_cidr=s.compute_subnet_cidr,
            storage_subnet_cidr=s.storage_subnet_cidr,
        ),
    )
    store = Storage(
        stem,
        StorageArgs(
            placement=at,
            account_name=naming.global_name(s, "data"),
            subnet_ids=[net.compute_subnet_id, net.storage_subnet_id],
            allowed_ips=s.storage_allowed_ips,
            protect_data=s.protect_data,
            # An acceptance stack's check reads the job's logs as the deployer.
            readers=(
                [BlobReader("deployer", client.object_id, deployer_principal_type())]
                if s.acceptance_profile
                else []
            ),
            subscription_id=client.subscription_id,
        ),
    )
    registry = Registry(
        stem,
        RegistryArgs(
            placement=at,
            registry_name=naming.global_name(s, "acr", 50),
            # The nodes reach the registry from the NAT gateway's address.
            allowed_ips=[net.nat_public_ip, *s.registry_allowed_ips],
        ),
    )
    ids = Identities(
        stem,
        IdentitiesArgs(
            placement=at,
            subscription_id=client.subscription_id,
            registry_id=registry.registry_id,
            storage_account_id=store.account_id,
        ),
    )
    nfs = NfsServer(stem, NfsArgs.from_settings(at, s, net, naming.global_name(s, "nfs")))
    cluster = GpuCluster(
        stem,
        GpuClusterArgs.from_settings(
            at,
            s,
            account_name=naming.global_name(s, "batch"),
            subnet_id=net.compute_subnet_id,
            node_identity_id=ids.nodes.id,
            storage_account_id=store.account_id,
            registry_server=registry.login_server,
            nfs=nfs,
            client=client,
        ),
        # Nodes pull images and write blobs as soon as they boot: grant the roles first.
        opts=pulumi.ResourceOptions(depends_on=ids.assignments),
    )
    if s.budget:
        CostBudget(
            stem,
            BudgetArgs(
                resource_group_id=rg.id,
                amount=s.budget,
                start_month=s.budget_start_month,
                emails=s.budget_emails,
            ),
        )
    Monitoring(
        stem,
        MonitoringArgs(
            placement=at,
            retention_days=s.log_retention_days,
            batch_account_id=cluster.account_id,
            storage_account_id=store.account_id,
            nfs_vm_id=nfs.vm_id,
        ),
    )
    image = TrainerImage(
        stem,
        TrainerImageArgs(
            builder=s.image_builder,
            placement=at,
            subscription_id=client.subscription_id,
            registry_name=registry.registry_name,
            registry_id=registry.registry_id,
            login_server=registry.login_server,
            registry_ready=[registry.task_bypass],
            base_image=base_reference(s.image_base, s.image_base_digest),
            source_repo=s.image_source_repo,
            tag=content_tag(),
            commit=commit,
            source_token=secret_setting("imageSourceToken"),
        ),
    )
    outputs: dict[str, Any] = {"image_ref": image.ref, "image_digest": image.digest}
    jobs: dict[str, dict[str, Any]] = {}
    for settings in s.jobs:
        shorthand = settings.name == SHORTHAND_JOB
        job = TrainingJob(
            # The shorthand's job keeps the name (and so the URN) it had before the jobs map.
            f"{stem}-job" if shorthand else f"{stem}-job-{settings.name}",
            TrainingJobArgs(
                stack=s.stack,
                endpoint=cluster.account_endpoint,
                account_id=cluster.account_id,
                pool_id=cluster.pool_id,
                node_count=settings.nodes,
                vm_size=s.vm_size,
                image_ref=image.ref,
                registry_server=registry.login_server,
                node_identity_id=ids.nodes.id,
                node_identity_client_id=ids.nodes.client_id,
                blob_endpoint=store.blob_endpoint,
                trainer_args=tuple(to_flags(settings.trainer_settings())),
                dataset_prefix=settings.dataset_prefix,
                name="" if shorthand else settings.name,
                priority=settings.priority,
                protect_running=s.protect_running_jobs and settings.name not in s.replace_jobs,
            ),
            # Data-plane calls need the deployer's Batch roles to exist first.
            opts=pulumi.ResourceOptions(depends_on=[cluster]),
        )
        jobs[settings.name] = {
            "job_id": job.job_id,
            "job_state": job.state,
            "task_state": job.task_state,
            "retries": job.retries,
            "job_portal_url": job.portal_url,
            "job_log_url": job.log_url,
            "job_checkpoint_path": job.checkpoint_path,
            "node_count": settings.nodes,
            "metrics_url": job.metrics_url,
            "step": job.step,
            "images_per_sec": job.images_per_sec,
        }
    if jobs:
        outputs["jobs"] = jobs
    if len(jobs) == 1:  # the one job's outputs at the top level too (the shorthand's outputs)
        (only,) = jobs.values()
        outputs.update({k: v for k, v in only.items() if k.startswith("job_")})
    return {
        **outputs,
        "resource_group_name": rg.name,
        "storage_account_name": store.account_name,
        "storage_containers": list(CONTAINERS),
        "nfs_address": nfs.address,
        "nfs_export_path": nfs.export_path,
        "registry_login_server": registry.login_server,
        "batch_account_endpoint": cluster.account_endpoint,
        "pool_id": cluster.pool_id,
        "node_count": s.node_count,
        "vm_size": s.vm_size,
    }


def _commit_to_build(s: StackSettings) -> str:
    """The commit the acr builder builds ("" for docker); a real `pulumi up` refuses
    uncommitted image inputs and a commit the remote lacks (infra.image.commit_to_build)."""
    return commit_to_build() if s.image_builder == "acr" else ""
