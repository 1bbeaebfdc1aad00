"""Network: VNet, compute and storage subnets, NSGs and a NAT gateway for outbound traffic."""

from __future__ import annotations

import pulumi
from pulumi_azure_native import network

from infra.naming import Placement
from infra.settings.network import NetworkSettings

NFS_PORTS = ["111", "2049"]


def _deny_internet_inbound() -> network.SecurityRuleArgs:
    # Azure's default rules already drop internet traffic at priority 65500; an explicit rule
    # keeps it denied even if someone adds a broader allow later, and makes the intent reviewable.
    return network.SecurityRuleArgs(
        name="deny-internet-inbound",
        priority=4096,
        direction=network.SecurityRuleDirection.INBOUND,
        access=network.SecurityRuleAccess.DENY,
        protocol=network.SecurityRuleProtocol.ASTERISK,
        source_address_prefix="Internet",
        source_port_range="*",
        destination_address_prefix="*",
        destination_port_range="*",
    )


class Network(pulumi.ComponentResource):
    vnet_id: pulumi.Output[str]
    compute_subnet_id: pulumi.Output[str]
    storage_subnet_id: pulumi.Output[str]
    nat_public_ip: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        settings: NetworkSettings,
        placement: Placement,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpucluster:infra:Network", name, None, opts)
        at = placement
        nat_ip, nat = self._nat_gateway(name, at)
        compute_nsg = self._compute_nsg(name, at)
        storage_nsg = self._storage_nsg(name, settings, at)
        compute_subnet, storage_subnet = self._vnet(
            name,
            settings.vnet_cidr,
            at,
            nat,
            (
                ("compute", settings.compute_subnet_cidr, compute_nsg),
                ("storage", settings.storage_subnet_cidr, storage_nsg),
            ),
        )
        self.compute_subnet_id = compute_subnet.id
        self.storage_subnet_id = storage_subnet.id
        self.nat_public_ip = nat_ip.ip_address.apply(lambda ip: ip or "")
        self.register_outputs(
            {
                "compute_subnet_id": self.compute_subnet_id,
                "storage_subnet_id": self.storage_subnet_id,
            }
        )

    def _nat_gateway(
        self, name: str, at: Placement
    ) -> tuple[network.PublicIPAddress, network.NatGateway]:
        """The subnets' only way out: a NAT gateway on one static public address."""
        nat_ip = network.PublicIPAddress(
            f"{name}-nat-ip",
            sku=network.PublicIPAddressSkuArgs(name=network.PublicIPAddressSkuName.STANDARD),
            public_ip_allocation_method=network.IPAllocationMethod.STATIC,
            **at.kwargs(),
            opts=pulumi.ResourceOptions(parent=self),
        )
        nat = network.NatGateway(
            f"{name}-nat",
            sku=network.NatGatewaySkuArgs(name=network.NatGatewaySkuName.STANDARD),
            public_ip_addresses=[network.SubResourceArgs(id=nat_ip.id)],
            idle_timeout_in_minutes=10,
            **at.kwargs(),
            opts=pulumi.ResourceOptions(parent=self),
        )
        return nat_ip, nat

    def _compute_nsg(self, name: str, at: Placement) -> network.NetworkSecurityGroup:
        return network.NetworkSecurityGroup(
            f"{name}-compute-nsg",
            security_rules=[_deny_internet_inbound()],
            **at.kwargs(),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _storage_nsg(
        self, name: str, settings: NetworkSettings, at: Placement
    ) -> network.NetworkSecurityGroup:
        """NFS from the compute subnet only."""
        return network.NetworkSecurityGroup(
            f"{name}-storage-nsg",
            security_rules=[
                network.SecurityRuleArgs(
                    name="allow-nfs-from-compute",
                    priority=100,
                    direction=network.SecurityRuleDirection.INBOUND,
                    access=network.SecurityRuleAccess.ALLOW,
                    protocol=network.SecurityRuleProtocol.ASTERISK,  # NFS uses TCP and UDP 111
                    source_address_prefix=settings.compute_subnet_cidr,
                    source_port_range="*",
                    destination_address_prefix=settings.storage_subnet_cidr,
                    destination_port_ranges=NFS_PORTS,
                ),
                network.SecurityRuleArgs(
                    name="deny-nfs-from-elsewhere",
                    priority=200,
                    direction=network.SecurityRuleDirection.INBOUND,
                    access=network.SecurityRuleAccess.DENY,
                    protocol=network.SecurityRuleProtocol.ASTERISK,
                    source_address_prefix="*",
                    source_port_range="*",
                    destination_address_prefix="*",
                    destination_port_ranges=NFS_PORTS,
                ),
                _deny_internet_inbound(),
            ],
            **at.kwargs(),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _vnet(
        self,
        name: str,
        vnet_cidr: str,
        at: Placement,
        nat: network.NatGateway,
        subnet_specs: tuple[tuple[str, str, network.NetworkSecurityGroup], ...],
    ) -> list[network.Subnet]:
        """The VNet and one subnet per ``(role, cidr, nsg)``, each behind its NSG and the NAT."""
        vnet = network.VirtualNetwork(
            f"{name}-vnet",
            address_space=network.AddressSpaceArgs(address_prefixes=[vnet_cidr]),
            **at.kwargs(),
            # Subnets are separate resources; an inline list would fight them on every update.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["subnets"]),
        )
        self.vnet_id = vnet.id
        # Azure updates a VNet's subnets one at a time: each subnet waits for the one before.
        subnets: list[network.Subnet] = []
        for role, cidr, nsg in subnet_specs:
            subnets.append(
                network.Subnet(
                    f"{name}-{role}",
                    resource_group_name=at.resource_group_name,
                    virtual_network_name=vnet.name,
                    address_prefix=cidr,
                    network_security_group=network.NetworkSecurityGroupArgs(id=nsg.id),
                    nat_gateway=network.SubResourceArgs(id=nat.id),
                    service_endpoints=[
                        network.ServiceEndpointPropertiesFormatArgs(service="Microsoft.Storage")
                    ],
                    default_outbound_access=False,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=subnets[-1:]),
                )
            )
        return subnets
