"""Storage: a Blob account for datasets, checkpoints, logs, outputs and code snapshots.

Identity-only access: shared keys are off, so every reader and writer uses Entra ID (managed
identities on the nodes, `az login` for people); HTTPS and TLS 1.2 only; no anonymous blobs;
the network denies by default and admits the VNet's subnets (service endpoints) and the public
addresses in storageAllowedIps (a laptop uploading datasets, a browser reading logs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization, storage

from infra.identity import STORAGE_BLOB_DATA_READER, assign_role, container_scope
from infra.naming import Placement

# code: the jobs' code snapshots (infra.code_upload), written by the deployer, read by nodes.
CONTAINERS = ("datasets", "checkpoints", "logs", "outputs", "code")
CHECKPOINTS = "checkpoints"  # its previous versions are the large ones (checkpointVersionDays)
SOFT_DELETE_DAYS = 7  # deleted blobs, versions and containers stay recoverable this long
# What the operators' commands read: `logs` (dt-jobs metrics, tensorboard, list; the job's
# refresh of its progress; job_log_url) and `outputs` (dt-jobs fetch).
OPERATOR_CONTAINERS = ("logs", "outputs")
# No SMB share: with shared keys off, SMB mounts only with a directory service's Kerberos
# identity (storage-files-active-directory-overview, read 2026-11-28), which Batch nodes lack;
# the shared file system is infra.nfs's.


@dataclass(frozen=True)
class BlobReader:
    """A principal granted Storage Blob Data Reader on ``containers`` (none: the account):
    the operators (the deployer, the team's group) on ``OPERATOR_CONTAINERS``; on acceptance
    stacks the deployer on the account, whose check reads the job's logs (python -m
    dt_commands.acceptance)."""

    label: str
    principal_id: pulumi.Input[str]
    principal_type: str  # User, Group or ServicePrincipal
    containers: tuple[str, ...] = ()


@dataclass(frozen=True)
class StorageArgs:
    placement: Placement
    account_name: str
    subnet_ids: Sequence[pulumi.Input[str]]
    allowed_ips: Sequence[str] = ()
    protect_data: bool = True
    blob_version_days: int = 7
    checkpoint_version_days: int = 1
    readers: Sequence[BlobReader] = ()
    subscription_id: pulumi.Input[str] = ""  # needed with readers


class Storage(pulumi.ComponentResource):
    account_name: pulumi.Output[str]
    account_id: pulumi.Output[str]

    def __init__(
        self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:Storage", name, None, opts)
        account = self._account(name, args)
        self.containers = self._blob_containers(name, args, account)
        self._version_expiry(name, args, account)
        self._readers(name, args, account)
        self.account_name = account.name
        self.account_id = account.id
        self.blob_endpoint = account.primary_endpoints.apply(lambda e: e.blob)
        self.register_outputs({"account_name": self.account_name})

    def _account(self, name: str, args: StorageArgs) -> storage.StorageAccount:
        return storage.StorageAccount(
            f"{name}-account",
            account_name=args.account_name,
            **args.placement.kwargs(),
            kind=storage.Kind.STORAGE_V2,
            sku=storage.SkuArgs(name=storage.SkuName.STANDARD_ZRS),
            enable_https_traffic_only=True,
            minimum_tls_version=storage.MinimumTlsVersion.TLS1_2,
            allow_blob_public_access=False,
            allow_shared_key_access=False,
            default_to_o_auth_authentication=True,
            allow_cross_tenant_replication=False,
            encryption=storage.EncryptionArgs(
                key_source=storage.KeySource.MICROSOFT_STORAGE,
                require_infrastructure_encryption=True,
            ),
            network_rule_set=_network_rules(args),
            # Datasets and checkpoints outlive compute: `pulumi destroy` leaves them unless the
            # stack opts out (protectData: false).
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect_data),
        )

    def _blob_containers(
        self, name: str, args: StorageArgs, account: storage.StorageAccount
    ) -> dict[str, storage.BlobContainer]:
        """The blob service (versioning, soft delete) and its private containers."""
        blob_service = storage.BlobServiceProperties(
            f"{name}-blob-service",
            account_name=account.name,
            resource_group_name=args.placement.resource_group_name,
            blob_services_name="default",
            is_versioning_enabled=True,
            delete_retention_policy=storage.DeleteRetentionPolicyArgs(
                enabled=True, days=SOFT_DELETE_DAYS
            ),
            container_delete_retention_policy=storage.DeleteRetentionPolicyArgs(
                enabled=True, days=SOFT_DELETE_DAYS
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        return {
            container: storage.BlobContainer(
                f"{name}-{container}",
                account_name=account.name,
                resource_group_name=args.placement.resource_group_name,
                container_name=container,
                public_access=storage.PublicAccess.NONE,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[blob_service]),
            )
            for container in CONTAINERS
        }

    def _version_expiry(
        self, name: str, args: StorageArgs, account: storage.StorageAccount
    ) -> None:
        """Previous versions are deleted ``checkpoint_version_days`` (checkpoints) or
        ``blob_version_days`` (every other container) after they were created; each deletion
        then spends the soft delete's 7 days before it is gone. Version age is the version's
        creation time, previous versions are the ``version`` element, for block blobs
        (lifecycle-management-policy-delete.md; the policy is named ``default``, prefixes start
        with a container: lifecycle-management-policy-structure.md; both read 2026-11-28)."""

        def rule(rule_name: str, containers: Sequence[str], days: int):
            return storage.ManagementPolicyRuleArgs(
                name=rule_name,
                type=storage.RuleType.LIFECYCLE,
                enabled=True,
                definition=storage.ManagementPolicyDefinitionArgs(
                    filters=storage.ManagementPolicyFilterArgs(
                        blob_types=["blockBlob"], prefix_match=[f"{c}/" for c in containers]
                    ),
                    actions=storage.ManagementPolicyActionArgs(
                        version=storage.ManagementPolicyVersionArgs(
                            delete=storage.DateAfterCreationArgs(
                                days_after_creation_greater_than=days
                            )
                        )
                    ),
                ),
            )

        others = [c for c in CONTAINERS if c != CHECKPOINTS]
        storage.ManagementPolicy(
            f"{name}-version-expiry",
            account_name=account.name,
            resource_group_name=args.placement.resource_group_name,
            management_policy_name="default",
            policy=storage.ManagementPolicySchemaArgs(
                rules=[
                    rule("checkpointversions", [CHECKPOINTS], args.checkpoint_version_days),
                    rule("previousversions", others, args.blob_version_days),
                ]
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.containers.values())),
        )

    def _readers(self, name: str, args: StorageArgs, account: storage.StorageAccount) -> None:
        for reader in args.readers:
            scopes: dict[str, tuple[pulumi.Input[str], list[pulumi.Resource]]] = (
                {
                    f"-{container}": (
                        container_scope(account.id, container),
                        [self.containers[container]],
                    )
                    for container in reader.containers
                }
                if reader.containers
                else {"": (account.id, [])}
            )
            for suffix, (scope, depends_on) in scopes.items():
                assign_role(
                    f"{name}-{reader.label}-blob-reader{suffix}",
                    role=STORAGE_BLOB_DATA_READER,
                    principal_id=reader.principal_id,
                    scope=scope,
                    subscription_id=args.subscription_id,
                    principal_type=authorization.PrincipalType(reader.principal_type),
                    parent=self,
                    depends_on=depends_on,
                )


def _network_rules(args: StorageArgs) -> storage.NetworkRuleSetArgs:
    """Deny by default; admit the VNet's subnets and the allowed public addresses."""
    return storage.NetworkRuleSetArgs(
        # The SDK's default action is Allow: deny explicitly.
        default_action=storage.DefaultAction.DENY,
        bypass=storage.Bypass.AZURE_SERVICES,
        virtual_network_rules=[
            storage.VirtualNetworkRuleArgs(virtual_network_resource_id=subnet_id)
            for subnet_id in args.subnet_ids
        ],
        # The machines that upload datasets and read job logs from outside the VNet
        # (storageAllowedIps; infra/settings/network.py checks Azure's rules for them).
        ip_rules=[
            storage.IPRuleArgs(i_p_address_or_range=ip, action=storage.Action.ALLOW)
            for ip in args.allowed_ips
        ],
    )
