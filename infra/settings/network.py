"""The network section: the VNet and its subnets, and the public addresses storage and the
registry admit. Checked here alone; how many nodes the compute subnet must hold is a rule across
sections (``infra.settings.rules``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from infra.ip_rules import ip_rule_problem
from infra.settings.checks import ConfigError, ipv4_network
from infra.settings.schema import setting


@dataclass(frozen=True, kw_only=True)
class NetworkSettings:
    """The VNet and its subnets, and the public addresses storage and the registry admit."""

    vnet_cidr: str = setting(
        "vnetCidr", "10.20.0.0/16", "Private address space of the virtual network."
    )
    compute_subnet_cidr: str = setting(
        "computeSubnetCidr", "10.20.0.0/20", "Subnet of the GPU nodes, inside vnetCidr."
    )
    storage_subnet_cidr: str = setting(
        "storageSubnetCidr", "10.20.16.0/24", "Subnet of the NFS server, inside vnetCidr."
    )
    storage_allowed_ips: tuple[str, ...] = setting(
        "storageAllowedIps",
        (),
        "Public IPs, or CIDRs from /16 to /30 (no private ranges), of machines that upload "
        "datasets and read logs from the data storage account (dt-data upload, job_log_url); "
        "the VNet's subnets are always allowed.",
    )
    registry_allowed_ips: tuple[str, ...] = setting(
        "registryAllowedIps",
        (),
        "Public IPs or CIDRs no wider than /16 (no private ranges) of build machines allowed to "
        "reach the registry; nodes are allowed through the NAT gateway.",
    )

    @property
    def nfs_server_ip(self) -> str:
        """The NFS server's static address: the first host Azure does not reserve."""
        return str(ipaddress.ip_network(self.storage_subnet_cidr)[4])

    @property
    def compute_subnet(self) -> ipaddress.IPv4Network:
        return ipv4_network("computeSubnetCidr", self.compute_subnet_cidr)

    def check(self) -> None:
        vnet = ipv4_network("vnetCidr", self.vnet_cidr)
        if not vnet.is_private:
            raise ConfigError(f"vnetCidr={self.vnet_cidr}: must be private (RFC 1918)")
        compute = self.compute_subnet
        storage = ipv4_network("storageSubnetCidr", self.storage_subnet_cidr)
        for key, subnet in (("computeSubnetCidr", compute), ("storageSubnetCidr", storage)):
            if not subnet.subnet_of(vnet):  # type: ignore[arg-type]
                raise ConfigError(f"{key}={subnet}: must lie inside vnetCidr={vnet}")
        if compute.overlaps(storage):
            raise ConfigError(
                f"computeSubnetCidr={compute} overlaps storageSubnetCidr="
                f"{storage}: give them separate ranges"
            )
        if storage.prefixlen > 28:
            raise ConfigError(f"storageSubnetCidr={storage}: use /28 or larger")
        for key, allowed, storage_rule in (
            ("registryAllowedIps", self.registry_allowed_ips, False),
            ("storageAllowedIps", self.storage_allowed_ips, True),
        ):
            for text in allowed:
                ipv4_network(key, text)
                problem = ip_rule_problem(text, storage=storage_rule)
                if problem is not None:
                    raise ConfigError(f"{key}={text!r}: {problem}")
