"""Managed identities and least-privilege role assignments (no keys, no passwords)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization, managedidentity

from infra.naming import Placement, role_assignment_name

# Built-in role definition GUIDs (the same in every tenant).
ACR_PULL = "7f951dda-4ed3-4680-a7ca-43fe172d538d"
ACR_PUSH = "8311e382-0749-4cb8-b61a-304f252e45ec"
# What an ABAC-mode registry honours instead of AcrPull (infra.registry_mode).
REPOSITORY_READER = "b93aa761-3e63-49ed-ac28-beffa264f7ac"
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
STORAGE_BLOB_DATA_READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
BATCH_JOB_SUBMITTER = "48e5e92e-a480-4e71-aa9c-2778f4c13781"
AZUREML_DATA_SCIENTIST = "f6c7c914-8db3-469d-8ca1-694a8f32e121"

# The nodes' data role on each Blob container (infra.storage.CONTAINERS), no more: Contributor
# where something on a node writes, Reader where it only reads.
NODE_BLOB_ROLES = {
    "datasets": STORAGE_BLOB_DATA_READER,  # dt-data stage (trainer.data.transfer), --init-from
    # Rank 0's mirror of each finished checkpoint (trainer.checkpoints.mirror, pruned: deletes)
    # and a resume's download of it; --init-from's weights.
    "checkpoints": STORAGE_BLOB_DATA_CONTRIBUTOR,
    "code": STORAGE_BLOB_DATA_READER,  # the jobs' snapshots (trainer.launch.code_folder)
    # Batch's output files (the tasks' stdout and stderr, infra.batch) and rank 0's live copy
    # of the metrics (trainer.outputs.live_upload).
    "logs": STORAGE_BLOB_DATA_CONTRIBUTOR,
    # Rank 0's results (trainer.outputs.results): uploads, a stale manifest deleted.
    "outputs": STORAGE_BLOB_DATA_CONTRIBUTOR,
}


def deployer_principal_type(env: Mapping[str, str] | None = None) -> str:
    """The kind of principal running `pulumi up`, which ARM requires on its role assignments
    (a wrong one fails with UnmatchedPrincipalType; azure-native sends "User" when none is
    given). azure-native authenticates as a service principal or managed identity when
    ARM_CLIENT_ID or ARM_USE_MSI is set (CI with OIDC); otherwise it uses the Azure CLI's
    login, whose own account record says whether that is a user or a service principal."""
    env = os.environ if env is None else env
    if env.get("ARM_CLIENT_ID") or env.get("ARM_USE_MSI", "").lower() in ("true", "1"):
        return "ServicePrincipal"
    az = shutil.which("az", path=env.get("PATH"))
    if az is not None:
        try:
            kind = subprocess.run(
                [az, "account", "show", "--query", "user.type", "-o", "tsv"],
                capture_output=True,
                text=True,
                timeout=60,
                env=dict(env),
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            kind = ""
        if kind == "servicePrincipal":
            return "ServicePrincipal"
    return "User"


def assign_role(
    name: str,
    *,
    role: pulumi.Input[str],
    principal_id: pulumi.Input[str],
    scope: pulumi.Input[str],
    subscription_id: pulumi.Input[str],
    principal_type: authorization.PrincipalType,
    parent: pulumi.Resource,
    retain_on_delete: bool = False,
    depends_on: Sequence[pulumi.Resource] = (),
) -> authorization.RoleAssignment:
    """Grant ``role`` at ``scope``. The assignment's GUID derives from scope, principal and role,
    so re-running never creates duplicates and a changed scope replaces it cleanly.
    ARM checks ``principal_type`` against the principal (and needs it for new identities, whose
    replication would otherwise fail the assignment)."""
    return authorization.RoleAssignment(
        name,
        principal_id=principal_id,
        principal_type=principal_type,
        scope=scope,
        role_definition_id=pulumi.Output.concat(
            "/subscriptions/",
            subscription_id,
            "/providers/Microsoft.Authorization/roleDefinitions/",
            role,
        ),
        role_assignment_name=pulumi.Output.all(scope, principal_id, role).apply(
            lambda values: role_assignment_name(values[0], values[1], values[2])
        ),
        opts=pulumi.ResourceOptions(
            parent=parent, retain_on_delete=retain_on_delete, depends_on=list(depends_on)
        ),
    )


@dataclass(frozen=True)
class IdentitiesArgs:
    placement: Placement
    subscription_id: pulumi.Input[str]
    registry_id: pulumi.Input[str]
    storage_account_id: pulumi.Input[str]
    # The account's containers by name (infra.storage.Storage.containers): each grant waits for
    # its container, which ARM needs to exist as the assignment's scope.
    blob_containers: Mapping[str, pulumi.Resource]
    # The role the registry honours for pulls: AcrPull, or what an imageRef's registry's mode
    # asks (infra.registry_mode).
    registry_pull_role: pulumi.Input[str] = ACR_PULL


def container_scope(account_id: pulumi.Input[str], container: str) -> pulumi.Output[str]:
    """A Blob container's ARM id, the scope of a role assignment on that container alone
    ("Scope a role assignment to a container", azure-docs
    articles/storage/blobs/assign-azure-role-data-access.md)."""
    return pulumi.Output.concat(account_id, "/blobServices/default/containers/", container)


class Identities(pulumi.ComponentResource):
    """``nodes``: pulls images; reads and writes Blob containers, each with its own role
    (``NODE_BLOB_ROLES``), never the whole account. Images are pushed by the ACR Task's own
    identity (infra/image.py) or the deployer's token.

    Batch auto-storage (infra.cluster) names this identity for "compute nodes that need access
    to auto-storage" (Batch management API, AutoStorageBaseProperties.nodeIdentityReference);
    auto-storage holds "the application packages and task resource files" (Azure Batch
    troubleshooting, use-managed-identities-azure-batch-account-pool). Batch documents no
    other use by the nodes and this program declares neither (tests/infra/
    test_node_blob_grants.py), so auto-storage gets no grant of its own."""

    def __init__(
        self, name: str, args: IdentitiesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:Identities", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.nodes = managedidentity.UserAssignedIdentity(
            f"{name}-nodes",
            **args.placement.kwargs(),
            opts=child,
        )
        # "acrpull" names the pull grant whatever its role: its URN stays that of existing stacks.
        self.assignments = [
            self._grant(name, "nodes-acrpull", args.registry_pull_role, args.registry_id, args)
        ]
        # Replaces the former account-wide Contributor (nodes-blob): `pulumi up` creates these
        # first and deletes a removed resource at the end of the update (docs/deploy.md).
        self.assignments += [
            self._grant(
                name,
                f"nodes-blob-{container}",
                role,
                container_scope(args.storage_account_id, container),
                args,
                depends_on=[args.blob_containers[container]],
            )
            for container, role in NODE_BLOB_ROLES.items()
        ]
        self.register_outputs({"nodes_id": self.nodes.id})

    def _grant(
        self,
        name: str,
        label: str,
        role: pulumi.Input[str],
        scope: pulumi.Input[str],
        args: IdentitiesArgs,
        depends_on: Sequence[pulumi.Resource] = (),
    ) -> authorization.RoleAssignment:
        return assign_role(
            f"{name}-{label}",
            role=role,
            principal_id=self.nodes.principal_id,
            scope=scope,
            subscription_id=args.subscription_id,
            principal_type=authorization.PrincipalType.SERVICE_PRINCIPAL,
            parent=self,
            depends_on=depends_on,
        )
