"""An AzureML workspace beside the Batch pool, for the stack's runs and registered models: the
stack's storage and registry, a key vault of its own, public network access off and a private
endpoint in the compute subnet (named there by two private DNS zones), the nodes' identity
allowed to write runs and models (MLflow's actions, no more).

Read 2026-11-29 (MicrosoftDocs/azure-ai-docs, articles/machine-learning/): concept-workspace.md
(a storage account and a key vault; the storage neither premium nor hierarchical),
how-to-disable-local-auth-storage.md (no shared keys: ``systemDatastoresAuthMode: identity``),
how-to-secure-workspace-vnet.md (a Premium registry; registry, storage and vault open to trusted
services), how-to-configure-private-link.md (group ``amlworkspace``, zones
privatelink.api.azureml.ms and privatelink.notebooks.azure.net),
how-to-use-mlflow-configure-tracking.md (what MLflow tracking and its model registry need)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import (
    authorization,
    keyvault,
    machinelearningservices,
    network,
    privatedns,
)

from infra.identity import assign_role
from infra.naming import Placement, role_assignment_name
from trainer.outputs.tracking import STUDIO

PRIVATE_LINK_GROUP = "amlworkspace"
DNS_ZONES = ("privatelink.api.azureml.ms", "privatelink.notebooks.azure.net")
# What MLflow tracking and the MLflow model registry need on a workspace
# (how-to-use-mlflow-configure-tracking.md, "Permissions"); the built-in AzureML Data Scientist
# also writes computes' neighbours (endpoints, datastores, environments), and AzureML Metrics
# Writer only metrics.
MLFLOW_ACTIONS = (
    "Microsoft.MachineLearningServices/workspaces/experiments/*",
    "Microsoft.MachineLearningServices/workspaces/jobs/*",
    "Microsoft.MachineLearningServices/workspaces/models/*/*",
)
# A destroyed vault's name stays taken while it is soft-deleted: the shortest Azure allows.
VAULT_RETENTION_DAYS = 7


@dataclass(frozen=True)
class WorkspaceArgs:
    placement: Placement
    workspace_name: str
    vault_name: str
    tenant_id: pulumi.Input[str]
    subscription_id: pulumi.Input[str]
    resource_group_id: pulumi.Input[str]
    storage_account_id: pulumi.Input[str]
    # The stack's own registry; None with an imageRef from elsewhere (the workspace then has
    # none until it builds an image).
    registry_id: pulumi.Input[str] | None
    vnet_id: pulumi.Input[str]
    endpoint_subnet_id: pulumi.Input[str]
    nodes_principal_id: pulumi.Input[str]
    protect_data: bool


class AzuremlWorkspace(pulumi.ComponentResource):
    # What a job that tracks here waits for: the nodes' role on the workspace and the names
    # that lead the nodes to its private endpoint.
    ready: list[pulumi.Resource]
    workspace_id: pulumi.Output[str]
    workspace_name: pulumi.Output[str]
    tracking_uri: pulumi.Output[str]
    studio_url: pulumi.Output[str]

    def __init__(
        self, name: str, args: WorkspaceArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:AzuremlWorkspace", name, None, opts)
        vault = self._vault(name, args)
        workspace = machinelearningservices.Workspace(
            f"{name}-mlw",
            workspace_name=args.workspace_name,
            **args.placement.kwargs(),
            sku=machinelearningservices.SkuArgs(
                name="Basic", tier=machinelearningservices.SkuTier.BASIC
            ),
            # AzureML grants its own identity what it needs on the storage, vault and registry
            # when it creates the workspace (how-to-identity-based-service-authentication.md).
            identity=machinelearningservices.ManagedServiceIdentityArgs(
                type=machinelearningservices.ManagedServiceIdentityType.SYSTEM_ASSIGNED
            ),
            storage_account=args.storage_account_id,
            key_vault=vault.id,
            container_registry=args.registry_id,
            system_datastores_auth_mode=machinelearningservices.SystemDatastoresAuthMode.IDENTITY,
            public_network_access=machinelearningservices.PublicNetworkAccessType.DISABLED,
            v1_legacy_mode=False,
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect_data),
        )
        self.ready = [
            self._private_endpoint(name, args, workspace),
            self._mlflow_writers(name, args, workspace),
        ]
        self.workspace_id = workspace.id
        self.workspace_name = workspace.name
        self.tracking_uri = workspace.ml_flow_tracking_uri
        self.studio_url = pulumi.Output.concat(
            f"{STUDIO}/?wsid=", workspace.id, "&tid=", args.tenant_id
        )
        self.register_outputs({"workspace_name": self.workspace_name})

    def _vault(self, name: str, args: WorkspaceArgs) -> keyvault.Vault:
        """The workspace's own vault: RBAC, purge-protected, closed to every network but Azure's
        trusted services (the workspace is one; nothing in the stack's network reads it)."""
        return keyvault.Vault(
            f"{name}-kv",
            vault_name=args.vault_name,
            **args.placement.kwargs(),
            properties=keyvault.VaultPropertiesArgs(
                tenant_id=args.tenant_id,
                sku=keyvault.SkuArgs(family=keyvault.SkuFamily.A, name=keyvault.SkuName.STANDARD),
                enable_rbac_authorization=True,
                enable_soft_delete=True,
                enable_purge_protection=True,
                soft_delete_retention_in_days=VAULT_RETENTION_DAYS,
                network_acls=keyvault.NetworkRuleSetArgs(
                    default_action=keyvault.NetworkRuleAction.DENY,
                    bypass=keyvault.NetworkRuleBypassOptions.AZURE_SERVICES,
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect_data),
        )

    def _private_endpoint(
        self, name: str, args: WorkspaceArgs, workspace: machinelearningservices.Workspace
    ) -> network.PrivateDnsZoneGroup:
        """The workspace's private endpoint in the compute subnet, named there by the two
        private zones the endpoint's group registers its addresses in."""
        child = pulumi.ResourceOptions(parent=self)
        endpoint = network.PrivateEndpoint(
            f"{name}-mlw-pe",
            **args.placement.kwargs(),
            subnet=network.SubnetArgs(id=args.endpoint_subnet_id),
            private_link_service_connections=[
                network.PrivateLinkServiceConnectionArgs(
                    name=f"{name}-mlw",
                    private_link_service_id=workspace.id,
                    group_ids=[PRIVATE_LINK_GROUP],
                )
            ],
            opts=child,
        )
        configs = []
        for zone_name in DNS_ZONES:
            label = zone_name.split(".")[1]  # api, notebooks
            zone = privatedns.PrivateZone(
                f"{name}-dns-{label}",
                private_zone_name=zone_name,
                resource_group_name=args.placement.resource_group_name,
                location="global",
                tags=args.placement.tag_map(),
                opts=child,
            )
            privatedns.VirtualNetworkLink(
                f"{name}-dns-{label}-link",
                private_zone_name=zone.name,
                resource_group_name=args.placement.resource_group_name,
                location="global",
                registration_enabled=False,
                virtual_network=privatedns.SubResourceArgs(id=args.vnet_id),
                tags=args.placement.tag_map(),
                opts=child,
            )
            configs.append(
                network.PrivateDnsZoneConfigArgs(name=label, private_dns_zone_id=zone.id)
            )
        return network.PrivateDnsZoneGroup(
            f"{name}-mlw-pe-dns",
            private_endpoint_name=endpoint.name,
            resource_group_name=args.placement.resource_group_name,
            private_dns_zone_group_name="default",
            private_dns_zone_configs=configs,
            opts=child,
        )

    def _mlflow_writers(
        self, name: str, args: WorkspaceArgs, workspace: machinelearningservices.Workspace
    ) -> authorization.RoleAssignment:
        """The nodes may track runs and register models in the workspace, no more: a role of
        ``MLFLOW_ACTIONS`` assigned on this workspace alone. Custom roles are defined for a
        management group, subscription or resource group, never for one resource
        (role-based-access-control/custom-roles.md, "AssignableScopes"): the stack's group."""
        role_id = workspace.id.apply(lambda ws: role_assignment_name(ws, "mlflow-writer"))
        role = authorization.RoleDefinition(
            f"{name}-mlflow-writer",
            role_definition_id=role_id,
            # Unique in the tenant, as a custom role's name must be: the same stack in another
            # subscription has a workspace of the same name.
            role_name=pulumi.Output.concat(
                "MLflow writer on ", workspace.name, " (", role_id.apply(lambda r: r[:8]), ")"
            ),
            description="Track MLflow runs and register models in one AzureML workspace.",
            scope=args.resource_group_id,
            assignable_scopes=[args.resource_group_id],
            permissions=[authorization.PermissionArgs(actions=list(MLFLOW_ACTIONS))],
            opts=pulumi.ResourceOptions(parent=self),
        )
        return assign_role(
            f"{name}-nodes-mlflow",
            role=role_id,
            principal_id=args.nodes_principal_id,
            scope=workspace.id,
            subscription_id=args.subscription_id,
            principal_type=authorization.PrincipalType.SERVICE_PRINCIPAL,
            parent=self,
            depends_on=[role],
        )
