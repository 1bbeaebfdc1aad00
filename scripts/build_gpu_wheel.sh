#!/usr/bin/env bash
# Build the image's Horovod wheel (NCCL GPU operations + Gloo, CC 8.0/9.0, our patch) on a
# machine without a GPU or a CUDA installation, the way the image's builder stage does, and
# cache it: the image's hardest step is then proven on every change, not first on Azure.
#
# Everything comes from PyPI: torch 2.13.0's CUDA 13.0 build with its nvidia-* wheels (the
# runtime libraries and NCCL the image runs with) and NVIDIA's CUDA 13.0 toolkit wheels for
# nvcc, its headers and cudart. No CUDA devel base image is needed.
#
# Usage: scripts/build_gpu_wheel.sh CACHE_DIR
# Prints two lines, the wheel's path and the build environment's python (tests/docker checks
# the wheel with it); build output goes to stderr. The build environment (about 5 GB) is kept
# under CACHE_DIR/gpu-build, keyed by its pins; the wheel under CACHE_DIR/wheels, keyed by
# build_horovod.sh (torch, Python, variant, patch).
set -euo pipefail
cd "$(dirname "$0")/.."

cache_dir=${1:?usage: build_gpu_wheel.sh CACHE_DIR}
python=${PYTHON:-python3}
# One place for the set: docker/Dockerfile takes the same pins from here (tests/docker checks).
TORCH_VERSION=2.13.0
CUDA_TOOLKIT="cuda-toolkit[nvcc,cccl,crt,cudart]==13.0.3"
CC_LIST=80,90
PINS=("torch==$TORCH_VERSION" "$CUDA_TOOLKIT" numpy==2.4.6 cloudpickle==3.1.2 psutil==7.2.2
  pyyaml==6.0.3 packaging==26.3 cffi==2.1.1 setuptools==84.2.1 wheel==0.48.0)
venv="$cache_dir/gpu-build/venv-$(echo "${PINS[*]}" | sha256sum | cut -c1-12)"
pip=("$venv/bin/python" -m pip --isolated --disable-pip-version-check --quiet)

if [ ! -f "$venv/.complete" ]; then
  rm -rf "$cache_dir/gpu-build"  # older build environments: 5 GB each
  "$python" -m venv "$venv"
  # --isolated: PyPI's torch (the CUDA build), whatever local index or wheel pip is set to use.
  "${pip[@]}" install "${PINS[@]}" >&2
  touch "$venv/.complete"
fi

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cuda="$site/nvidia/cu13"
# nvcc's profile (bin/nvcc.profile) adds $(TOP)/lib64 to the link path; the wheels ship lib.
[ -e "$cuda/lib64" ] || ln -s lib "$cuda/lib64"
# The linker wants unversioned names; the wheels ship only libcudart.so.13 and the like.
for library in "$cuda"/lib/lib*.so.*[0-9]; do
  [ -e "${library%%.so.*}.so" ] || ln -s "$(basename "$library")" "${library%%.so.*}.so"
done
nccl=$("$venv/bin/python" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
[ -e "$nccl/lib/libnccl.so" ] || ln -s libnccl.so.2 "$nccl/lib/libnccl.so"

PATH="$cuda/bin:$PATH" CUDA_HOME="$cuda" HOROVOD_CUDA_HOME="$cuda" \
  HOROVOD_NCCL_HOME="$nccl" HOROVOD_NCCL_LINK=SHARED HOROVOD_BUILD_CUDA_CC_LIST="$CC_LIST" \
  scripts/build_horovod.sh "$venv/bin/python" "$cache_dir/wheels" gpu
echo "$venv/bin/python"
