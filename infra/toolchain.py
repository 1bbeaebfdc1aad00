"""The CUDA set the trainer image and the pool's nodes must agree on.

torch 2.13.0's Linux wheel on PyPI is a CUDA 13.0 build: its metadata requires
``cuda-toolkit==13.0.*`` and ``nvidia-nccl-cu13`` (tests/docker reads it with
``pip install --dry-run --report``). So the image needs no CUDA base: its builder stage compiles
Horovod's GPU kernels with that toolkit's own wheels (nvcc, headers, cudart:
scripts/build_gpu_wheel.sh), Horovod links the NCCL of torch's own ``nvidia-nccl-cu13`` wheel,
and every node needs a driver of the R580 branch or newer: CUDA 13.0 needs 580.65.06 (CUDA 13.0
release notes, "CUDA Toolkit and Corresponding Driver Versions"; NVIDIA's data-center support
matrix lists R580 as the branch for CUDA 13.x). The Azure HPC Ubuntu 24.04 images the pool
runs carry R580 since their 2026-01 refresh (Azure/azhpc-images #478); the pool's start task
checks the driver on every node anyway.

The base's OS is part of the set: docker/Dockerfile installs its packages with apt, by Ubuntu
22.04's names (python3.11 is in jammy-updates' universe, packages.ubuntu.com/jammy-updates/
python3.11; rdma-core's InfiniBand user space, OpenMPI and UCX), which images of the
RHEL-like families have no apt for and other Ubuntu releases name otherwise.
"""

from __future__ import annotations

import re

CUDA = "13.0"
MIN_DRIVER = "580.65.06"
# The CUDA version at the front of an nvidia/cuda style tag: 13.0.1-devel-ubuntu22.04 -> 13.0.
_CUDA_TAG = re.compile(r":(\d+\.\d+)\.\d+-[^@]*$")
BASE_OS = "ubuntu22.04"
APT_FAMILIES = ("ubuntu", "debian")
_OS_FAMILIES = "ubuntu|debian|ubi|rockylinux|oraclelinux|centos|opensuse|amzn|alpine"
# The OS at the end of an nvidia/cuda style tag (its image families: ubuntu, ubi, rockylinux,
# oraclelinux; older ones centos, opensuse): 13.0.1-devel-ubuntu22.04 -> ubuntu22.04.
_OS_TAG = re.compile(rf":[^@]*-((?:{_OS_FAMILIES})\d+(?:\.\d+)*)$")
# An OS's own image, named by its release: ubuntu:22.04, docker.io/library/debian:12.
_OS_IMAGE = re.compile(rf"(?:^|/)({_OS_FAMILIES}):(\d+(?:\.\d+)*)(?:@.*)?$")


# What the trainer image holds unpacked, in GB: the pool's OS disk must take it beside the HPC
# image (dt-plan prints both). Measured on 2026-11-26 with `du -s` after `pip install
# --isolated` into empty folders: torch 2.13.0 with its CUDA 13.0 wheels (no toolkit: the image
# runs on torch's own libraries) and docker/requirements.txt; the OS layer is estimated from
# Ubuntu's package sizes.
IMAGE_PARTS_GB = (
    ("torch 2.13.0 and its CUDA 13.0 wheels (measured)", 4.7),
    ("the trainer's other Python requirements (measured)", 0.3),
    ("Horovod with NCCL operations (measured)", 0.1),
    ("Ubuntu 22.04, Python 3.11, rdma-core, libjpeg (estimated)", 0.4),
)
# While Docker pulls, a layer's compressed download sits beside its unpacked files: assume the
# compressed image is about half the unpacked one.
PULL_OVERHEAD = 0.5


def image_unpacked_gb() -> float:
    return round(sum(size for _, size in IMAGE_PARTS_GB), 1)


def cuda_of_base(image_base: str) -> str | None:
    """The CUDA major.minor an ``nvidia/cuda``-style tag names, None when the tag has none."""
    found = _CUDA_TAG.search(image_base)
    return found.group(1) if found else None


def os_of_base(image_base: str) -> str | None:
    """The OS of an OS image (``ubuntu:22.04`` -> ubuntu22.04) or the one an ``nvidia/cuda``-
    style tag ends with; None when the reference names none (a base of one's own)."""
    if own := _OS_IMAGE.search(image_base):
        return own.group(1) + own.group(2)
    found = _OS_TAG.search(image_base)
    return found.group(1) if found else None


def base_reference(image_base: str, digest: str) -> str:
    """The one reference the Dockerfile's ``FROM ${BASE_IMAGE}`` builds from: the tag, pinned by
    its digest when the stack gives one (``name:tag@sha256:...`` is a valid reference)."""
    return f"{image_base}@{digest}" if digest else image_base
