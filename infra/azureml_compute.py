"""The AzureML backend's nodes (``backend: azureml``): a compute cluster of the stack's size in
its compute subnet, and the trainer image as the workspace's environment. The cluster has no
public IPs and no SSH, takes the nodes' user-assigned identity (registry pull, the stack's Blob
containers, the workspace's MLflow role), accepts Entra tokens only, and scales to zero after
``idleMinutes`` (``scaleMode: fixed`` keeps ``nodeCount`` nodes).

Read 2026-11-29 (MicrosoftDocs/azure-ai-docs, articles/machine-learning/):
how-to-create-attach-compute-cluster.md (names, scale to zero, low priority),
how-to-secure-training-vnet.md (no public IP: the workspace's private endpoint and a NAT
gateway), how-to-identity-based-service-authentication.md (the compute's identity pulls with
AcrPull), concept-environments.md (a version from a Docker image, never changed in place)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization
from pulumi_azure_native import machinelearningservices as ml

from infra.identity import AZUREML_DATA_SCIENTIST, assign_role
from infra.naming import Placement

ENVIRONMENT = "trainer"  # the environment's name in the workspace; its versions: the images


@dataclass(frozen=True)
class ComputeArgs:
    placement: Placement
    workspace_name: pulumi.Input[str]
    workspace_id: pulumi.Input[str]
    subscription_id: pulumi.Input[str]
    # The team's principal (jobSubmitterObjectId) and its kind; None: the deployer alone, whose
    # Owner (the deployer's prerequisite) already submits jobs.
    team: tuple[str, str] | None
    compute_name: str
    vm_size: str
    node_count: int
    spot: bool
    # 0 scales to zero when idle (autoscale); nodeCount keeps them (fixed).
    min_nodes: int
    idle_minutes: int
    subnet_id: pulumi.Input[str]
    node_identity_id: pulumi.Input[str]
    image_ref: pulumi.Input[str]
    # What the nodes need before the first starts: the identity's roles (registry, Blob, the
    # workspace) and the workspace's private endpoint and names.
    after: Sequence[pulumi.Resource]


def environment_version(image_ref: str) -> str:
    """The environment's version for an image: a hash of its reference (a tag or a digest, so a
    new image is a new version; AzureML never changes a version in place)."""
    return hashlib.sha256(image_ref.encode()).hexdigest()[:16]


def idle_time(minutes: int) -> str:
    """``idleMinutes`` as AzureML's scale-down delay, an ISO 8601 duration."""
    return f"PT{minutes}M"


class AzuremlCompute(pulumi.ComponentResource):
    compute_name: pulumi.Output[str]
    compute_id: pulumi.Output[str]
    environment_id: pulumi.Output[str]

    def __init__(
        self, name: str, args: ComputeArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:AzuremlCompute", name, None, opts)
        compute = self._cluster(name, args)
        environment = self._environment(name, args)
        if args.team is not None:
            self._team_submits(name, args, *args.team)
        self.compute_name = compute.name
        self.compute_id = compute.id
        self.environment_id = environment.id
        self.register_outputs({"compute_name": self.compute_name})

    def _cluster(self, name: str, args: ComputeArgs) -> ml.Compute:
        """The AmlCompute cluster, started only once ``args.after`` exists."""
        at = args.placement
        priority = ml.VmPriority.LOW_PRIORITY if args.spot else ml.VmPriority.DEDICATED
        return ml.Compute(
            f"{name}-amlc",
            compute_name=args.compute_name,
            workspace_name=args.workspace_name,
            **at.kwargs(),
            identity=ml.ManagedServiceIdentityArgs(
                type=ml.ManagedServiceIdentityType.USER_ASSIGNED,
                user_assigned_identities=[args.node_identity_id],
            ),
            properties=ml.AmlComputeArgs(
                compute_type="AmlCompute",
                description=f"{args.node_count} x {args.vm_size} for the stack's training jobs",
                disable_local_auth=True,  # Entra tokens only, as everywhere in the stack
                properties=ml.AmlComputePropertiesArgs(
                    vm_size=args.vm_size,
                    vm_priority=priority,
                    os_type=ml.OsType.LINUX,
                    scale_settings=ml.ScaleSettingsArgs(
                        min_node_count=args.min_nodes,
                        max_node_count=args.node_count,
                        node_idle_time_before_scale_down=idle_time(args.idle_minutes),
                    ),
                    subnet=ml.ResourceIdArgs(id=args.subnet_id),
                    enable_node_public_ip=False,
                    remote_login_port_public_access=ml.RemoteLoginPortPublicAccess.DISABLED,
                    isolated_network=False,
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.after)),
        )

    def _environment(self, name: str, args: ComputeArgs) -> ml.EnvironmentVersion:
        """The image as a version of the ``trainer`` environment."""
        at = args.placement
        return ml.EnvironmentVersion(
            f"{name}-env",
            name=ENVIRONMENT,
            version=pulumi.Output.from_input(args.image_ref).apply(environment_version),
            workspace_name=args.workspace_name,
            resource_group_name=at.resource_group_name,
            properties=ml.EnvironmentVersionPropertiesArgs(
                image=args.image_ref,
                os_type=ml.OperatingSystemType.LINUX,
                description="The trainer image (docker/Dockerfile), as the stack built or named it",
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _team_submits(self, name: str, args: ComputeArgs, principal: str, kind: str) -> None:
        """The team submits and operates its jobs on this compute and reads their runs, in this
        workspace alone (how-to-assign-roles.md: AzureML Data Scientist, all but the workspace
        itself, its computes and its role assignments)."""
        assign_role(
            f"{name}-team-azureml",
            role=AZUREML_DATA_SCIENTIST,
            principal_id=principal,
            scope=args.workspace_id,
            subscription_id=args.subscription_id,
            principal_type=authorization.PrincipalType(kind),
            parent=self,
        )
