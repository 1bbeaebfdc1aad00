"""The GPU cluster: a Batch account (Entra auth only) and an InfiniBand pool.

The pool: an HPC image with its node agent, containers pulled from the registry by managed
identity, the NFS share mounted on every node, inter-node communication for multi-instance
(MPI/NCCL) tasks, simplified node communication with no public IPs, fixed size or an autoscale
formula that drops to zero when idle, and a start task that fails a sick node, so a job never
lands on it (infra/node_checks.py: the checks, and the watcher that keeps a node out later).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization, batch

from infra.identity import BATCH_JOB_SUBMITTER, assign_role
from infra.job_spec import NFS_RELATIVE_MOUNT
from infra.naming import Placement
from infra.node_checks import node_check_command
from infra.settings.cluster import ClusterSettings

POOL_ID = "ib-gpu"


def autoscale_formula(nodes: int, idle_minutes: int, spot: bool = False) -> str:
    """Start the whole pool when any task is queued or running; go to zero after
    ``idle_minutes`` without one. A multi-instance job needs all its nodes at once, so the
    formula switches between 0 and the full size rather than following the task count.

    A formula sees task and node counts and metrics, never node states
    (articles/batch/batch-automatic-scaling.md): nodes that failed their start task keep the
    waiting task pending, and so the pool up. Nothing here can detect that; the job's
    ``pool_errors`` output and ``dt-jobs status`` report it, with the action that ends the
    billing (cancel the job; infra/pool_health.py). A Spot pool asks for its nodes through
    ``$TargetLowPriorityNodes`` (``scale_settings``) and for no dedicated ones."""
    wanted = "$TargetLowPriorityNodes" if spot else "$TargetDedicatedNodes"
    # A variable the formula leaves alone keeps its value: a Spot pool asks for 0 dedicated.
    none_dedicated = ["$TargetDedicatedNodes = 0;"] if spot else []
    return "\n".join(
        [
            f"$window = TimeInterval_Minute * {idle_minutes};",
            "$now = max(0, $PendingTasks.GetSample(1));",
            "$recent = $PendingTasks.GetSamplePercent($window) < 50 ? $now : "
            "max($PendingTasks.GetSample($window));",
            "$busy = max($now, $recent) > 0;",
            f"{wanted} = $busy ? {nodes} : 0;",
            *none_dedicated,
            "$NodeDeallocationOption = taskcompletion;",
        ]
    )


@dataclass(frozen=True)
class GpuClusterArgs:
    """What the pool needs besides its settings section: names and the other components'
    outputs. The deployer is ``authorization.get_client_config_output()``'s object, of the
    principal type ``identity.deployer_principal_type`` finds."""

    placement: Placement
    account_name: str
    subnet_id: pulumi.Input[str]
    node_identity_id: pulumi.Input[str]
    storage_account_id: pulumi.Input[str]
    registry_server: pulumi.Input[str]
    prefetch_image: pulumi.Input[str] | None  # pulled by each node as it joins (PullSource)
    nfs_source: pulumi.Input[str]
    nfs_mount_options: str
    deployer_object_id: pulumi.Input[str]
    deployer_type: str
    subscription_id: pulumi.Input[str]
    acceptance_profile: str = ""  # "" for team stacks (infra.settings.stack.ACCEPTANCE_PROFILES)
    # What must exist before the first node boots: its roles (it pulls and writes blobs at once)
    # and the image it prefetches. On the pool itself: a component's depends_on does not order
    # its children (pulumi/pulumi #8721; depending ON a component waits for its children, #7732).
    pool_after: Sequence[pulumi.Resource] = ()


class GpuCluster(pulumi.ComponentResource):
    """The Batch account, its pool and the roles that submit jobs to it; one private step per
    concern."""

    account_endpoint: pulumi.Output[str]
    pool_id: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        cluster: ClusterSettings,
        args: GpuClusterArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpucluster:infra:GpuCluster", name, None, opts)
        identity_ref = batch.ComputeNodeIdentityReferenceArgs(resource_id=args.node_identity_id)
        account = self._account(name, args, identity_ref)
        pool = self._pool(name, cluster, args, account, identity_ref)
        self._grant_submitters(name, cluster, args, account)
        self.account_id = account.id
        self.account_endpoint = account.account_endpoint
        self.pool_id = pool.name
        self.register_outputs({"account_endpoint": self.account_endpoint, "pool_id": self.pool_id})

    def _account(
        self,
        name: str,
        args: GpuClusterArgs,
        identity_ref: batch.ComputeNodeIdentityReferenceArgs,
    ) -> batch.BatchAccount:
        """Entra auth only; auto-storage through the nodes' identity (no account keys)."""
        return batch.BatchAccount(
            f"{name}-batch",
            account_name=args.account_name,
            **args.placement.kwargs(),
            pool_allocation_mode=batch.PoolAllocationMode.BATCH_SERVICE,
            allowed_authentication_modes=[batch.AuthenticationMode.AAD],
            identity=batch.BatchAccountIdentityArgs(
                type=batch.ResourceIdentityType.USER_ASSIGNED,
                user_assigned_identities=[args.node_identity_id],
            ),
            auto_storage=batch.AutoStorageBasePropertiesArgs(
                storage_account_id=args.storage_account_id,
                authentication_mode=batch.AutoStorageAuthenticationMode.BATCH_ACCOUNT_MANAGED_IDENTITY,
                node_identity_reference=identity_ref,
            ),
            public_network_access=batch.PublicNetworkAccessType.ENABLED,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _pool(
        self,
        name: str,
        cluster: ClusterSettings,
        args: GpuClusterArgs,
        account: batch.BatchAccount,
        identity_ref: batch.ComputeNodeIdentityReferenceArgs,
    ) -> batch.Pool:
        size = cluster.gpu
        return batch.Pool(
            f"{name}-pool",
            pool_name=POOL_ID,
            account_name=account.name,
            resource_group_name=args.placement.resource_group_name,
            display_name=f"{size.name} x {cluster.node_count}",
            vm_size=size.name,
            deployment_configuration=batch.DeploymentConfigurationArgs(
                virtual_machine_configuration=_vm_configuration(cluster, args, identity_ref)
            ),
            identity=batch.BatchPoolIdentityArgs(
                type=batch.PoolIdentityType.USER_ASSIGNED,
                user_assigned_identities=[args.node_identity_id],
            ),
            # Multi-instance tasks (one rank group per node) need the nodes to talk directly.
            inter_node_communication=batch.InterNodeCommunicationState.ENABLED,
            task_slots_per_node=1,
            task_scheduling_policy=batch.TaskSchedulingPolicyArgs(
                node_fill_type=batch.ComputeNodeFillType.SPREAD
            ),
            network_configuration=_network_configuration(args.subnet_id),
            target_node_communication_mode=batch.NodeCommunicationMode.SIMPLIFIED,
            mount_configuration=[
                batch.MountConfigurationArgs(
                    nfs_mount_configuration=batch.NFSMountConfigurationArgs(
                        source=args.nfs_source,
                        relative_mount_path=NFS_RELATIVE_MOUNT,
                        mount_options=args.nfs_mount_options,
                    )
                )
            ],
            scale_settings=scale_settings(cluster),
            metadata=_pool_metadata(cluster, args.acceptance_profile),
            start_task=batch.StartTaskArgs(
                command_line=node_check_command(size.gpus, size.ib_ports, size.nvme_disks),
                user_identity=batch.UserIdentityArgs(
                    auto_user=batch.AutoUserSpecificationArgs(
                        elevation_level=batch.ElevationLevel.ADMIN, scope=batch.AutoUserScope.POOL
                    )
                ),
                wait_for_success=True,
                max_task_retry_count=1,
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.pool_after)),
        )

    def _grant_submitters(
        self, name: str, cluster: ClusterSettings, args: GpuClusterArgs, account: batch.BatchAccount
    ) -> None:
        """Job Submitter, nothing more: it creates, updates, terminates and deletes jobs and
        reads task files, but cannot resize or delete pools (Batch Data Contributor could).
        Whoever runs `pulumi up` submits the job (TrainingJob), so the deployer always gets it,
        with its real principal type: the same stack is deployed by people (User) and by CI
        (ServicePrincipal). The team's principal is granted separately."""
        submitters: list[tuple[str, pulumi.Input[str], authorization.PrincipalType]] = [
            ("deployer", args.deployer_object_id, authorization.PrincipalType(args.deployer_type))
        ]
        if cluster.job_submitter_object_id:
            team_type = authorization.PrincipalType(cluster.job_submitter_type)
            submitters.append(("team", cluster.job_submitter_object_id, team_type))
        for label, principal, principal_type in submitters:
            assign_role(
                f"{name}-{label}-submitter",
                role=BATCH_JOB_SUBMITTER,
                principal_id=principal,
                scope=account.id,
                subscription_id=args.subscription_id,
                principal_type=principal_type,
                parent=self,
                # A new deployer (a person after CI, CI after a person) replaces the deployer's
                # assignment: the earlier deployer keeps its grant, and with it the jobs it
                # operates. The account's deletion removes what is left.
                retain_on_delete=label == "deployer",
            )


def _vm_configuration(
    cluster: ClusterSettings,
    args: GpuClusterArgs,
    identity_ref: batch.ComputeNodeIdentityReferenceArgs,
) -> batch.VirtualMachineConfigurationArgs:
    """The size's HPC image and node agent, the OS disk, and containers pulled from the registry
    with the nodes' identity."""
    image = cluster.gpu.image
    return batch.VirtualMachineConfigurationArgs(
        image_reference=batch.ImageReferenceArgs(
            publisher=image.publisher,
            offer=image.offer,
            sku=image.sku,
            version="latest",
        ),
        node_agent_sku_id=image.node_agent_sku_id,
        # Docker's data root is on the OS disk: the HPC image leaves about 20 GB of its 64 GB
        # free, less than the trainer image needs while it is pulled (Batch API 2024-07-01,
        # VirtualMachineConfiguration.osDisk.diskSizeGB).
        os_disk=batch.OSDiskArgs(disk_size_gb=cluster.os_disk_size_gb),
        container_configuration=batch.ContainerConfigurationArgs(
            type=batch.ContainerType.DOCKER_COMPATIBLE,
            # "The container configuration pulls container images to the VMs when the pool is
            # created" and as nodes join; a node whose pull fails is unusable and is not
            # recovered (articles/batch/batch-docker-container-workloads.md and
            # batch-pool-node-error-checking.md, read 2026-11-29).
            container_image_names=[args.prefetch_image] if args.prefetch_image else None,
            container_registries=[
                batch.ContainerRegistryArgs(
                    registry_server=args.registry_server,
                    identity_reference=identity_ref,
                )
            ],
        ),
    )


def _network_configuration(subnet_id: pulumi.Input[str]) -> batch.NetworkConfigurationArgs:
    """The compute subnet, no public IPs (the nodes leave through the NAT gateway)."""
    return batch.NetworkConfigurationArgs(
        subnet_id=subnet_id,
        public_ip_address_configuration=batch.PublicIPAddressConfigurationArgs(
            provision=batch.IPAddressProvisioningType.NO_PUBLIC_IP_ADDRESSES
        ),
        enable_accelerated_networking=True,
    )


def _pool_metadata(
    cluster: ClusterSettings, acceptance_profile: str
) -> list[batch.MetadataItemArgs]:
    """Read by the policy pack: the CPU acceptance size only on a pool that says it is an
    acceptance pool, and jobs that wait for a debugger on a production stack only on a pool
    that allows them. checkpointing records the stack's setting."""
    items = [batch.MetadataItemArgs(name="checkpointing", value=str(cluster.checkpointing).lower())]
    if acceptance_profile:
        items.append(batch.MetadataItemArgs(name="acceptance", value=acceptance_profile))
    if cluster.allow_debugger:
        items.append(batch.MetadataItemArgs(name="debugger", value="allowed"))
    return items


def scale_settings(cluster: ClusterSettings) -> batch.ScaleSettingsArgs:
    """A fixed pool, or the autoscale formula that drops to zero when idle. Spot nodes are
    asked for through the low-priority fields: since March 2026 "any use of Low-priority
    properties in the Azure Batch API or SDK will automatically translate into Spot-based
    compute node allocations" in Batch-managed accounts (Azure/Batch #196, 2026-02-25, read
    2026-11-28). All Spot or all dedicated, never both (infra.settings.cluster)."""
    spot = cluster.node_count if cluster.spot else 0
    if cluster.scale_mode == "fixed":
        return batch.ScaleSettingsArgs(
            fixed_scale=batch.FixedScaleSettingsArgs(
                target_dedicated_nodes=cluster.node_count - spot,
                # Unset on a dedicated pool, as before Spot: an upgrade changes no input.
                target_low_priority_nodes=spot or None,
                resize_timeout="PT30M",
                node_deallocation_option=batch.ComputeNodeDeallocationOption.TASK_COMPLETION,
            )
        )
    return batch.ScaleSettingsArgs(
        auto_scale=batch.AutoScaleSettingsArgs(
            formula=autoscale_formula(cluster.node_count, cluster.idle_minutes, cluster.spot),
            evaluation_interval="PT5M",
        )
    )
