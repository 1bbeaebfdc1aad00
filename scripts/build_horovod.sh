#!/usr/bin/env bash
# Build a Horovod 0.28.1 wheel that works with torch >= 2.1 and cache it.
#
# Horovod's last release (0.28.1, an sdist) compiles its torch extension as C++14, but torch >= 2.1
# headers need C++17. Both CMakeLists.txt files must change: changing only horovod/torch/ gives a
# link error on gloo::rendezvous::Store::kDefaultTimeout (DESIGN.md, "Facts").
#
# Usage: scripts/build_horovod.sh PYTHON WHEEL_DIR [gpu]
#   PYTHON     interpreter whose environment already holds torch and the build requirements
#   WHEEL_DIR  where the finished wheel is cached; an existing wheel for this torch is reused
#   gpu        also build NCCL GPU operations (the Docker image uses this; needs CUDA + NCCL)
# The local setup (Makefile) and docker/Dockerfile both call this script, so the two builds match.
# It also applies our patches, scripts/horovod-patches/*.patch in the order of their names (each
# file's header says what it changes and why); DT_HOROVOD_PATCHES names a subset instead (file
# names, space-separated; bench/baseline_horovod.py builds the engine without the later ones).
# Build output goes to stderr; stdout is the wheel's path.
set -euo pipefail

HOROVOD_VERSION=0.28.1
python=${1:?usage: build_horovod.sh PYTHON WHEEL_DIR [gpu]}
wheel_dir=${2:?usage: build_horovod.sh PYTHON WHEEL_DIR [gpu]}
variant=${3:-cpu}
patch_dir="$(cd "$(dirname "$0")" && pwd)/horovod-patches"
read -r -a patch_names <<<"${DT_HOROVOD_PATCHES-$(cd "$patch_dir" && echo *.patch)}"
patches=()
for name in "${patch_names[@]}"; do
  [ -f "$patch_dir/$name" ] || {
    echo "horovod: DT_HOROVOD_PATCHES names $name, which $patch_dir does not hold" >&2
    exit 2
  }
  patches+=("$patch_dir/$name")
done

torch_version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
py_tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
patch_id=$( (echo "${patch_names[@]}"; cat "${patches[@]}" </dev/null) | sha256sum | cut -c1-12)
# The wheel links against one torch ABI: the cache key names torch, Python, the variant and the
# patches, so a changed, added or left-out patch never reuses a wheel built otherwise.
cache_dir="$wheel_dir/horovod-$HOROVOD_VERSION-torch$torch_version-$py_tag-$variant-$patch_id"
if compgen -G "$cache_dir/horovod-*.whl" >/dev/null; then
  echo "horovod: cached wheel in $cache_dir" >&2
  echo "$cache_dir"/horovod-*.whl
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" >&2
tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
src="$work/horovod-$HOROVOD_VERSION"
for cmake_file in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
  grep -q 'set(CMAKE_CXX_STANDARD 14)' "$cmake_file" || {
    echo "horovod: $cmake_file no longer sets C++14; review the C++17 patch" >&2
    exit 1
  }
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$cmake_file"
done
for patch_file in "${patches[@]}"; do
  patch --forward --batch --quiet --fuzz=0 -p1 -d "$src" <"$patch_file" >&2 || {
    echo "horovod: $patch_file no longer applies to $HOROVOD_VERSION; review the patch" >&2
    exit 1
  }
done

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
export MAKEFLAGS="-j$(nproc)"
if [ "$variant" = gpu ]; then
  export HOROVOD_GPU_OPERATIONS=NCCL
else
  export HOROVOD_CPU_OPERATIONS=GLOO
fi

echo "horovod: building $HOROVOD_VERSION ($variant) for torch $torch_version, a few minutes" >&2
# Build into a temporary folder and move the finished wheel, so an interrupted build never
# leaves a half-written wheel in the cache.
"$python" -m pip wheel --no-build-isolation --no-deps "$src" -w "$work/dist" >&2
mkdir -p "$cache_dir"
mv "$work"/dist/horovod-*.whl "$cache_dir/"
echo "horovod: wheel cached in $cache_dir" >&2
echo "$cache_dir"/horovod-*.whl
