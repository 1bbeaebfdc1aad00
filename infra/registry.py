"""Container registry: Premium ACR with the admin user and anonymous pull off.

Nodes pull with their managed identity (AcrPull); builds push with theirs (AcrPush). The network
denies by default and admits the NAT gateway's address (the nodes' egress), the configured build
machines, and trusted Azure services (ACR Tasks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import containerregistry as acr

from infra.naming import Placement


@dataclass(frozen=True)
class RegistryArgs:
    placement: Placement
    registry_name: str
    allowed_ips: Sequence[pulumi.Input[str]]


class Registry(pulumi.ComponentResource):
    login_server: pulumi.Output[str]
    registry_id: pulumi.Output[str]

    def __init__(
        self, name: str, args: RegistryArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:Registry", name, None, opts)
        registry = acr.Registry(
            f"{name}-acr",
            registry_name=args.registry_name,
            resource_group_name=args.placement.resource_group_name,
            location=args.placement.location,
            sku=acr.SkuArgs(name=acr.SkuName.PREMIUM),
            admin_user_enabled=False,
            anonymous_pull_enabled=False,
            public_network_access=acr.PublicNetworkAccess.ENABLED,
            network_rule_bypass_options=acr.NetworkRuleBypassOptions.AZURE_SERVICES,
            network_rule_set=acr.NetworkRuleSetArgs(
                default_action=acr.DefaultAction.DENY,
                ip_rules=[
                    acr.IPRuleArgs(i_p_address_or_range=ip, action=acr.Action.ALLOW)
                    for ip in args.allowed_ips
                ],
            ),
            policies=acr.PoliciesArgs(
                export_policy=acr.ExportPolicyArgs(status=acr.ExportPolicyStatus.DISABLED),
                retention_policy=acr.RetentionPolicyArgs(days=30, status=acr.PolicyStatus.ENABLED),
            ),
            tags=args.placement.tag_map(),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.login_server = registry.login_server
        self.registry_id = registry.id
        self.registry_name = registry.name
        self.register_outputs({"login_server": self.login_server})
