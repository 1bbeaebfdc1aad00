"""The InfiniBand GPU sizes we support, the retired ones we refuse (with the reason), and the
CPU size that only acceptance stacks may use.
Why it is built this way: docs/internals.md, `infra/sizes.py`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainer.launch.node_sizes import CPU_FABRICS, FABRICS, SIZES


@dataclass(frozen=True)
class BatchImage:
    publisher: str
    offer: str
    sku: str
    node_agent_sku_id: str
    # The Azure HPC images are built on a 64 GB OS disk (Azure/azhpc-images packer/source.pkr.hcl,
    # os_disk_size_gb = 64, read 2026-11-28); a pool's osDisk.diskSizeGB may grow it, never shrink
    # it. Their drivers, CUDA, MPI and tools fill about 45 GB of it (reported; not measured here),
    # and Docker's data root, where the trainer image lands, is on the same disk.
    os_disk_gb: int = 64
    os_used_gb: int = 45


UBUNTU_HPC_2404 = BatchImage("microsoft-dsvm", "ubuntu-hpc", "2404", "batch.node.ubuntu 24.04")
UBUNTU_HPC_2204 = BatchImage("microsoft-dsvm", "ubuntu-hpc", "2204", "batch.node.ubuntu 22.04")


@dataclass(frozen=True)
class GpuSize:
    """A pool size's Azure facts. ``gpus == 0`` only for the CPU acceptance size."""

    name: str
    vcpus: int  # what the Batch account's per-family core quota counts
    # InfiniBand ports the start task requires ACTIVE: one HCA per GPU on every ND IB size.
    ib_ports: int
    image: BatchImage
    regions: frozenset[str]
    # Local NVMe disks beside the temporary disk, and their room in all, which the start task
    # assembles into one RAID0 array for staged datasets and job code (infra/node_checks.py);
    # 0 where the size has none and the temporary disk takes them. Read 2026-11-28: ND H100 v5
    # and ND H200 v5 have 8 NVMe disks, 28000 GiB in all (ndh100v5-series.md "Local Storage
    # 28000 GiB", nd-h200-v5-series.md), left unassembled by the HPC image (Azure/azhpc-images
    # customizations/setup_nvme.sh writes an nvme-raid unit that ndv5.sh never enables); ND
    # A100 v4 documents one local disk, 6000 GiB (ND96asr_v4, ndasra100v4-series.md) and 6400
    # GiB (ND96amsr_A100_v4, ndma100v4-series.md), used as the temporary disk.
    nvme_disks: int = 0
    nvme_gib: int = 0

    @property
    def gpus(self) -> int:
        """GPUs per node, from the launcher's table (``trainer.launch.node_sizes``)."""
        return SIZES[self.name].gpus


# Regions: where this project has tested or planned capacity. Azure lists where each family is
# offered only on its "Products available by region" page; that page, and any region list in the
# ND H100 v5, ND H200 v5, ND A100 v4 or NDm A100 v4 size pages (articles/virtual-machines/sizes),
# were not found in the docs as of 2026-11-28, so no region below is confirmed by Azure: check
# `az vm list-skus --size <name> --location <region>` before relying on one.
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
            "Standard_ND96isr_H100_v5",
            96,
            8,
            UBUNTU_HPC_2404,
            _H100_REGIONS,
            nvme_disks=8,
            nvme_gib=28000,
        ),
        GpuSize(
            "Standard_ND96isr_H200_v5",
            96,
            8,
            UBUNTU_HPC_2404,
            frozenset({"eastus2", "swedencentral", "westus3"}),
            nvme_disks=8,
            nvme_gib=28000,
        ),
        GpuSize("Standard_ND96asr_v4", 96, 8, UBUNTU_HPC_2404, _A100_REGIONS),
        GpuSize("Standard_ND96amsr_A100_v4", 96, 8, UBUNTU_HPC_2404, _A100_REGIONS),
    )
}

# NCv3's retirement date and NDv2's driver break (Azure/azhpc-images #406) as recorded when these
# entries were written; not re-checked in the docs as of 2026-11-28.
RETIRED: dict[str, str] = {
    "Standard_NC24rs_v3": "NCv3 (V100) was retired on 2025-09-30",
    "Standard_NC24rs_v2": "NCv2 (P100) is retired",
    "Standard_NC24r": "NC (K80) is retired",
    "Standard_ND24rs": "ND (P40) is retired",
    "Standard_ND40rs_v2": "NDv2 (V100) is not recognised by current HPC image drivers "
    "(azhpc-images #406)",
}

# InfiniBand GPU sizes Azure offers that this project cannot run yet: why, and what it would take
# (docs/internals.md, infra/sizes.py). Read 2026-11-28.
_GRACE = (
    "{family} hosts are Arm64 (NVIDIA Grace CPUs, 4 GPUs each: {doc}) while the trainer image and "
    "its Horovod are built for amd64, and Batch documents no node agent for their HPC image "
    "(microsoft-dsvm ubuntu-hpc 2404-gb: azhpc-images #603; Batch's Arm64 pools are the "
    "Cobalt-100 sizes, Azure/Batch #185); supporting it takes an arm64 image build, that "
    "image in Batch, and the size's GPUs and bandwidth floors in the launcher's table"
)
NOT_YET: dict[str, str] = {
    "Standard_ND128isr_NDR_GB200_v6": _GRACE.format(
        family="ND GB200 v6", doc="nd-gb200-v6-series-summary.md"
    ),
    "Standard_ND128isr_GB300_v6": _GRACE.format(family="ND GB300 v6", doc="nd-gb300-v6-series.md"),
    "Standard_ND128isrG5_GB300_v6": _GRACE.format(
        family="ND GB300 v6", doc="nd-gb300-v6-series.md"
    ),
    "Standard_ND96isr_MI300X_v5": (
        "ND MI300X v5 has AMD GPUs, which run ROCm and RCCL (ndmi300xv5-series-summary.md) while "
        "the image's torch and Horovod are CUDA and NCCL builds and the start task checks NVIDIA "
        "drivers; supporting it takes a ROCm image (torch's ROCm wheels, Horovod on RCCL), a "
        "start task that checks the AMD driver, and the ubuntu-hpc 2204-rocm image in Batch, "
        "which Batch does not document"
    ),
}

# The CPU acceptance size. Batch needs a local temporary disk, where it keeps the node's Batch tree
# (Azure/Batch #121: Easv5 "is not" supported for "lack of" a "Local temporary disk";
# files-and-directories.md; read 2026-11-28): Dsv5 has none (dv5-dsv5-series.md), Ddsv5 has 75
# GiB on its D2ds_v5 (ddv5-ddsv5-series.md). The GPU tables' regions offer the general-purpose
# Ddsv5 family too: a location that fits the GPU acceptance profile fits the CPU one.
CPU_ACCEPTANCE: dict[str, GpuSize] = {
    "Standard_D2ds_v5": GpuSize(
        "Standard_D2ds_v5", 2, 0, UBUNTU_HPC_2404, _H100_REGIONS | _A100_REGIONS
    )
}


def check_same_sizes(
    azure_name: str, azure: Mapping[str, object], launcher_name: str, launcher: Mapping[str, object]
) -> None:
    """Raise ``RuntimeError`` (one line) unless both tables name the same VM sizes: a size with
    Azure facts but no launcher settings (or the reverse) would deploy a pool no job can use."""
    only_azure = sorted(set(azure) - set(launcher))
    only_launcher = sorted(set(launcher) - set(azure))
    if not only_azure and not only_launcher:
        return
    differences = [
        *(f"{size} only in {azure_name}" for size in only_azure),
        *(f"{size} only in {launcher_name}" for size in only_launcher),
    ]
    raise RuntimeError(
        f"{azure_name} and {launcher_name} must name the same VM sizes: "
        f"{'; '.join(differences)}; add the size to both tables or remove it from both"
    )


check_same_sizes(
    "infra/sizes.py SUPPORTED", SUPPORTED, "trainer/launch/node_sizes.py FABRICS", FABRICS
)
check_same_sizes(
    "infra/sizes.py CPU_ACCEPTANCE",
    CPU_ACCEPTANCE,
    "trainer/launch/node_sizes.py CPU_FABRICS",
    CPU_FABRICS,
)


def size_of(name: str) -> GpuSize:
    """The table entry of a GPU size or of the CPU acceptance size; ``KeyError`` otherwise."""
    return SUPPORTED[name] if name in SUPPORTED else CPU_ACCEPTANCE[name]
