"""The one table per VM size the launcher runs on: GPUs per node (one worker each), the NCCL
and InfiniBand settings, and the bus bandwidth a healthy pool reaches between nodes and within
one (NVLink), whose fraction is the preflight's floor. ``infra/sizes.py`` keeps only the Azure
facts of the same sizes (vCPUs, Batch image, regions) and checks at import that it names exactly
these; the job (``infra/trainer_command.py``) puts the floor on the trainer's command line, and the
launcher's preflight holds nodes and pairs to both. Standard library only: the Pulumi program
and the dynamic provider host import this module.
Why it is built this way: docs/internals.md, `trainer/launch/node_sizes.py`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fabric:
    """What the launcher and the job know of a VM size."""

    gpus: int  # per node; 0 only for the CPU acceptance size
    # Multi-node NCCL allreduce bus bandwidth (GB/s) a healthy pool reaches with large messages
    # (approximate, from published nccl-tests runs on these sizes; which runs was not recorded, and
    # no Azure figure for it was found in the docs as of 2026-11-28); the preflight floor is a
    # fraction of it.
    busbw_gbps: float
    env: dict[str, str] = field(default_factory=dict)
    # NCCL's topology file, the first that exists on the node (the HPC images moved it).
    topo_files: tuple[str, ...] = ()
    # Single-node NCCL allreduce bus bandwidth (GB/s) of all the node's GPUs over NVLink/NVSwitch
    # with large messages; the launcher's preflight holds each node to a fraction of it.
    nvlink_busbw_gbps: float = 0.0


_COMMON = {
    "NCCL_IB_PCI_RELAXED_ORDERING": "1",
    "NCCL_SOCKET_IFNAME": "eth0",  # bootstrap over the VNet NIC; data over the IB HCAs
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # the topology file lists GPUs in PCI order
    "NCCL_NET_GDR_LEVEL": "PHB",
}
# The Azure HPC images' own NCCL settings for NDv5 and NDv4 (Azure/azhpc-images
# customizations/ndv5.sh at bf3b320e and customizations/ndv4.sh at 4657de67, not re-read as of
# 2026-11-28, which write them to the host's /etc/nccl.conf, where a container never reads
# them): the topology file under /opt/microsoft/<family>/, and NCCL ignoring the CPU affinity it
# inherits, so it binds each rank next to its GPU itself.
_NDV5 = {**_COMMON, "NCCL_IGNORE_CPU_AFFINITY": "1"}
_NDV4 = {**_COMMON, "NCCL_IGNORE_CPU_AFFINITY": "1"}
# /opt/microsoft/<family>/topo.xml is the current place; /opt/microsoft/<family>-topo.xml the
# deprecated one that older images have only.
_NDV5_TOPO = ("/opt/microsoft/ndv5/topo.xml", "/opt/microsoft/ndv5-topo.xml")
_NDV4_TOPO = ("/opt/microsoft/ndv4/topo.xml", "/opt/microsoft/ndv4-topo.xml")

# NVLink baselines: 8x H100/H200 SXM (NVLink 4, NVSwitch) reach 460-480 GB/s, 8x A100 SXM4
# (NVLink 3) 230-250 GB/s in nccl-tests all_reduce_perf at large sizes (Alaya NeW, "NCCL-tests
# in practice", 2026-05-06, read 2026-11-28); the lower ends, rounded down.
_H100_NVLINK = 450.0
_A100_NVLINK = 230.0

SIZES: dict[str, Fabric] = {
    "Standard_ND96isr_H100_v5": Fabric(8, 350.0, _NDV5, _NDV5_TOPO, _H100_NVLINK),
    "Standard_ND96isr_H200_v5": Fabric(8, 350.0, _NDV5, _NDV5_TOPO, _H100_NVLINK),
    "Standard_ND96asr_v4": Fabric(8, 180.0, _NDV4, _NDV4_TOPO, _A100_NVLINK),
    "Standard_ND96amsr_A100_v4": Fabric(8, 180.0, _NDV4, _NDV4_TOPO, _A100_NVLINK),
    # The CPU acceptance size: one worker (Gloo) per node, nothing to tune, no bandwidth floor.
    "Standard_D2ds_v5": Fabric(0, 0.0),
}
FABRICS: dict[str, Fabric] = {name: f for name, f in SIZES.items() if f.gpus}
CPU_FABRICS: dict[str, Fabric] = {name: f for name, f in SIZES.items() if not f.gpus}
PREFLIGHT_FRACTION = 0.7
# Ranks one node may start (--workers-per-node, a sweep's --workers): far more than any VM's
# GPUs, few enough that a typo is refused before the launcher sets up an environment per worker.
MAX_WORKERS_PER_NODE = 256
# Settings that must not leak into a run on an InfiniBand size (from a base image or a user).
FORBIDDEN_ON_IB = ("NCCL_IB_DISABLE", "NCCL_NET")


def fabric_for(vm_size: str) -> Fabric:
    try:
        return SIZES[vm_size]
    except KeyError:
        known = ", ".join(FABRICS)
        raise ValueError(
            f"vm_size={vm_size}: not an InfiniBand GPU size; use one of {known}"
        ) from None


def workers_per_node(vm_size: str) -> int:
    """One worker per GPU; one (on the CPU) for a size without GPUs."""
    return max(1, fabric_for(vm_size).gpus)


def preflight_floor(vm_size: str) -> float:
    """The bus bandwidth (GB/s) the preflight requires between nodes; 0.0 (no preflight)
    without InfiniBand."""
    return round(fabric_for(vm_size).busbw_gbps * PREFLIGHT_FRACTION, 1)


def node_floor(vm_size: str) -> float:
    """The bus bandwidth (GB/s) the preflight requires of a node's own GPUs together (NVLink);
    0.0 on a size without GPUs."""
    return round(fabric_for(vm_size).nvlink_busbw_gbps * PREFLIGHT_FRACTION, 1)


def worker_environment(
    vm_size: str | None,
    inherited: dict[str, str],
    exists: Callable[[str], bool] = os.path.exists,
) -> dict[str, str]:
    """``inherited`` with the size's fabric settings applied and forbidden ones removed; an
    explicit value in ``inherited`` wins over the table (operators may tune), except those.
    NCCL_TOPO_FILE names the first topology file that ``exists`` on this node, if any."""
    env = dict(inherited)
    # CPU (a simulation, or the CPU acceptance size): Gloo over TCP, nothing to tune.
    if vm_size is None or fabric_for(vm_size).gpus == 0:
        return env
    for key in FORBIDDEN_ON_IB:
        env.pop(key, None)
    fabric = fabric_for(vm_size)
    for key, value in fabric.env.items():
        env.setdefault(key, value)
    topo = next((path for path in fabric.topo_files if exists(path)), None)
    if topo is not None:
        env.setdefault("NCCL_TOPO_FILE", topo)
    return env
