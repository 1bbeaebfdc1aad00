"""InfiniBand and NCCL settings per VM size, and the bandwidth the preflight expects.

The values follow the Azure HPC images' own configuration: NCCL reads the VM's PCIe/NUMA
topology from the file the image ships (the container mounts /opt/microsoft read-only), relaxed
PCIe ordering lets GPUDirect RDMA reach line rate on these virtualized hosts, and UCX (used by
HPC-X/OpenMPI) gets the same hint. NCCL_IB_DISABLE is never set on an InfiniBand size: that
would silently route every gradient over TCP (the mistake an earlier reference made).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fabric:
    gpus: int
    # Multi-node NCCL allreduce bus bandwidth (GB/s) a healthy pool reaches with large messages
    # (approximate, from published nccl-tests runs on these sizes); the preflight floor is a
    # fraction of it.
    busbw_gbps: float
    env: dict[str, str] = field(default_factory=dict)


_COMMON = {
    "NCCL_IB_PCI_RELAXED_ORDERING": "1",
    "UCX_IB_PCI_RELAXED_ORDERING": "on",
    "NCCL_SOCKET_IFNAME": "eth0",  # bootstrap over the VNet NIC; data over the IB HCAs
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # the topology file lists GPUs in PCI order
    "UCX_TLS": "rc",
    "NCCL_NET_GDR_LEVEL": "PHB",
}
_NDV5 = {**_COMMON, "NCCL_TOPO_FILE": "/opt/microsoft/ndv5-topo.xml"}
_NDV4 = {**_COMMON, "NCCL_TOPO_FILE": "/opt/microsoft/ndv4-topo.xml"}

FABRICS: dict[str, Fabric] = {
    "Standard_ND96isr_H100_v5": Fabric(8, 350.0, _NDV5),
    "Standard_ND96isr_H200_v5": Fabric(8, 350.0, _NDV5),
    "Standard_ND96asr_v4": Fabric(8, 180.0, _NDV4),
    "Standard_ND96amsr_A100_v4": Fabric(8, 180.0, _NDV4),
}
PREFLIGHT_FRACTION = 0.7
# Settings that must not leak into a run on an InfiniBand size (from a base image or a user).
FORBIDDEN_ON_IB = ("NCCL_IB_DISABLE", "NCCL_NET")


def fabric_for(vm_size: str) -> Fabric:
    try:
        return FABRICS[vm_size]
    except KeyError:
        known = ", ".join(FABRICS)
        raise ValueError(
            f"vm_size={vm_size}: not an InfiniBand GPU size; use one of {known}"
        ) from None


def preflight_floor(vm_size: str) -> float:
    return round(fabric_for(vm_size).busbw_gbps * PREFLIGHT_FRACTION, 1)


def worker_environment(vm_size: str | None, inherited: dict[str, str]) -> dict[str, str]:
    """``inherited`` with the size's fabric settings applied and forbidden ones removed; an
    explicit value in ``inherited`` wins over the table (operators may tune), except those."""
    env = dict(inherited)
    if vm_size is None:  # CPU / simulation: Gloo over TCP, nothing to tune
        return env
    for key in FORBIDDEN_ON_IB:
        env.pop(key, None)
    for key, value in fabric_for(vm_size).env.items():
        env.setdefault(key, value)
    return env
