"""The CUDA set the trainer image and the pool's nodes must agree on.
Why it is built this way: docs/internals.md, `infra/toolchain.py`."""

from __future__ import annotations

import re

CUDA = "13.0"
MIN_DRIVER = "580.65.06"
# The CUDA version at the front of an nvidia/cuda style tag: 13.0.1-devel-ubuntu22.04 -> 13.0.
_CUDA_TAG = re.compile(r":(\d+\.\d+)\.\d+-[^@]*$")
# The trainer image's base (docker/Dockerfile's default BASE_IMAGE): a Debian release's slim image,
# whose Python (3.13) the image runs the trainer with.
BASE_IMAGE = "debian:13-slim"
BASE_OS = "debian13"
BASE_PYTHON = "python3.13"
APT_FAMILIES = ("ubuntu", "debian")
_OS_FAMILIES = "ubuntu|debian|ubi|rockylinux|oraclelinux|centos|opensuse|amzn|alpine"
# The OS at the end of an nvidia/cuda style tag (its image families: ubuntu, ubi, rockylinux,
# oraclelinux; older ones centos, opensuse): 13.0.1-devel-ubuntu22.04 -> ubuntu22.04.
_OS_TAG = re.compile(rf":[^@]*-((?:{_OS_FAMILIES})\d+(?:\.\d+)*)$")
# An OS's own image, named by its release (Debian's slim variant too): debian:13-slim,
# docker.io/library/ubuntu:22.04.
_OS_IMAGE = re.compile(rf"(?:^|/)({_OS_FAMILIES}):(\d+(?:\.\d+)*)(?:-slim)?(?:@.*)?$")


# What the trainer image holds unpacked, in GB: the pool's OS disk must take it beside the HPC
# image (dt-plan prints both). Measured on 2026-11-26 with `du -s` after `pip install
# --isolated` into empty folders: torch 2.13.0 with its CUDA 13.0 wheels (no toolkit: the image
# runs on torch's own libraries) and docker/requirements.txt; the OS layer measured on 2026-11-29
# in the image `make image` built (5.63 GB in all; Debian 13 and its packages under /usr 0.26 GB,
# the base's other folders and the apt lists' remains the rest).
IMAGE_PARTS_GB = (
    ("torch 2.13.0 and its CUDA 13.0 wheels (measured)", 4.7),
    ("the trainer's other Python requirements (measured)", 0.3),
    ("Horovod with NCCL operations (measured)", 0.1),
    ("Debian 13, Python 3.13, rdma-core, libjpeg (measured)", 0.5),
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
    """The OS of an OS image (``debian:13-slim`` -> debian13) or the one an ``nvidia/cuda``-
    style tag ends with; None when the reference names none (a base of one's own)."""
    if own := _OS_IMAGE.search(image_base):
        return own.group(1) + own.group(2)
    found = _OS_TAG.search(image_base)
    return found.group(1) if found else None


def base_reference(image_base: str, digest: str) -> str:
    """The one reference the Dockerfile's ``FROM ${BASE_IMAGE}`` builds from: the tag, pinned by
    its digest when the stack gives one (``name:tag@sha256:...`` is a valid reference)."""
    return f"{image_base}@{digest}" if digest else image_base
