"""The InfiniBand GPU sizes we support, and the retired ones we refuse (with the reason).

Exact size strings: the IB sizes are not in azure-native's deprecated VirtualMachineSizeTypes
enum, so they are plain strings. Images pair with their Batch node agent: the Azure HPC images
(microsoft-dsvm:ubuntu-hpc) carry MOFED/DOCA-OFED, HPC-X, NCCL, the NVIDIA driver and the
container toolkit. The 22.04 agent reaches end of life on 2027-06-30 (Azure/Batch #200), so 24.04
is the default. Regions are the ones this project has tested or planned capacity in; add to them
as quota is granted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchImage:
    publisher: str
    offer: str
    sku: str
    node_agent_sku_id: str


UBUNTU_HPC_2404 = BatchImage("microsoft-dsvm", "ubuntu-hpc", "2404", "batch.node.ubuntu 24.04")
UBUNTU_HPC_2204 = BatchImage("microsoft-dsvm", "ubuntu-hpc", "2204", "batch.node.ubuntu 22.04")


@dataclass(frozen=True)
class GpuSize:
    name: str
    vcpus: int  # what the Batch account's per-family core quota counts
    gpus: int
    gpu: str
    ib_gbps_per_gpu: int
    # InfiniBand ports the start task requires ACTIVE: one HCA per GPU on every ND IB size.
    ib_ports: int
    image: BatchImage
    regions: frozenset[str]


_H100_REGIONS = frozenset(
    {"eastus", "eastus2", "southcentralus", "westus3", "westeurope", "swedencentral", "uksouth"}
)
_A100_REGIONS = frozenset(
    {"eastus", "eastus2", "southcentralus", "westus2", "westus3", "westeurope", "japaneast"}
)

SUPPORTED: dict[str, GpuSize] = {
    s.name: s
    for s in (
        GpuSize(
            "Standard_ND96isr_H100_v5", 96, 8, "H100 80GB", 400, 8, UBUNTU_HPC_2404, _H100_REGIONS
        ),
        GpuSize(
            "Standard_ND96isr_H200_v5",
            96,
            8,
            "H200 141GB",
            400,
            8,
            UBUNTU_HPC_2404,
            frozenset({"eastus2", "swedencentral", "westus3"}),
        ),
        GpuSize("Standard_ND96asr_v4", 96, 8, "A100 40GB", 200, 8, UBUNTU_HPC_2404, _A100_REGIONS),
        GpuSize(
            "Standard_ND96amsr_A100_v4", 96, 8, "A100 80GB", 200, 8, UBUNTU_HPC_2404, _A100_REGIONS
        ),
    )
}

RETIRED: dict[str, str] = {
    "Standard_NC24rs_v3": "NCv3 (V100) was retired on 2025-09-30",
    "Standard_NC24rs_v2": "NCv2 (P100) is retired",
    "Standard_NC24r": "NC (K80) is retired",
    "Standard_ND24rs": "ND (P40) is retired",
    "Standard_ND40rs_v2": "NDv2 (V100) is not recognised by current HPC image drivers "
    "(azhpc-images #406)",
}
