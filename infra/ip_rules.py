"""Which addresses an allow-list (storageAllowedIps, registryAllowedIps) may admit: public
ones, in ranges no wider than a /16. Pure (no Pulumi): shared by the stack settings
(``infra.settings.network``) and the policy pack (``policy/rules.py``), so the two can never
disagree."""

from __future__ import annotations

import ipaddress

# The widest range an allow-list (storageAllowedIps, registryAllowedIps) may name. Azure sets no
# lower bound itself: storage and ACR IP rules take any public CIDR, 0.0.0.0/1 included, which
# would undo the design's default-deny network rule sets (articles/storage/common/
# storage-network-security.md, "Azure Storage firewall and virtual network rules";
# articles/container-registry/container-registry-access-selected-networks.md, "Configure public
# IP network rules"). The lists exist to admit named machines: a laptop, build agents, an office's
# egress, which are single addresses or small blocks; a range wider than a /16 (65,536
# addresses) is a whole ISP or cloud-region allocation, so anyone renting a VM there would be
# let in. Name narrower ranges, several if need be.
MIN_ALLOWED_PREFIX = 16
# Ranges that are not public internet addresses. Storage IP network rules "aren't allowed for
# private address ranges (RFC 1918)" and ACR IP rules filter traffic to the registry's public
# endpoint only: traffic from a private range never arrives from the internet, it reaches the
# account or registry through a VNet rule or a private endpoint (the VNet's subnets and the NAT
# gateway are already admitted). The documentation ranges of RFC 5737 (192.0.2.0/24,
# 198.51.100.0/24, 203.0.113.0/24) are kept: they are what examples and the offline plan use.
NON_PUBLIC_RANGES = tuple(
    ipaddress.IPv4Network(cidr)
    for cidr in (
        "0.0.0.0/8",  # "this network" (RFC 1122)
        "10.0.0.0/8",  # RFC 1918
        "100.64.0.0/10",  # shared address space, carrier-grade NAT (RFC 6598)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local, and Azure's platform addresses 169.254.169.254
        "172.16.0.0/12",  # RFC 1918
        "192.0.0.0/24",  # IETF protocol assignments (RFC 6890)
        "192.168.0.0/16",  # RFC 1918
        "198.18.0.0/15",  # benchmarking (RFC 2544)
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the broadcast address
    )
)


def ip_rule_problem(text: str, *, storage: bool) -> str | None:
    """Why an allow-list entry (an IPv4 address or CIDR, already parsed once) may not be an IP
    rule of a storage account (``storage``) or a registry, with the fix; None when it may.
    Shared by ``StackSettings`` and the policy pack (policy/rules.py)."""
    network = ipaddress.IPv4Network(text, strict=False)
    inside = [r for r in NON_PUBLIC_RANGES if network.subnet_of(r)]
    if network.prefixlen < MIN_ALLOWED_PREFIX and not inside:
        whole = " (the whole internet)" if network.prefixlen == 0 else ""
        return (
            f"a /{network.prefixlen} is {network.num_addresses:,} addresses{whole}, wider than "
            f"the /{MIN_ALLOWED_PREFIX} an allow-list may name (it would open the default-deny "
            "network rules to a whole provider's block); list the machines' own addresses"
        )
    private = inside or [r for r in NON_PUBLIC_RANGES if network.overlaps(r)]
    if private:
        return (
            f"not a public address ({private[0]} is private or reserved); IP rules admit public "
            "addresses only (private traffic comes through the VNet's subnets or a private "
            "endpoint): give the public address the machine is seen from"
        )
    # Storage IP rules take public IPv4 addresses or ranges of /30 and larger: "/31 or /32 are
    # not supported ... use individual IP address rules"
    # (articles/storage/common/storage-network-security-ip-address-range.md).
    if storage and "/" in text and network.prefixlen > 30:
        return (
            f"Azure storage takes /30 or larger ranges; give the address alone "
            f"({network.network_address})"
        )
    return None
