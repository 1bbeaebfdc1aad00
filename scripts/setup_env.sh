#!/usr/bin/env bash
# Create or update .venv with the pinned dependencies and a Horovod built for the pinned torch.
# Idempotent: the Makefile reruns it when pyproject.toml or these scripts change. The Horovod
# wheel (minutes to build) is cached outside the checkout, so fresh clones reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
  echo "error: PYTHON=$python is $("$python" --version 2>&1); this project needs Python 3.11" >&2
  exit 2
}
cache_dir=${1:?usage: setup_env.sh CACHE_DIR (the Makefile gives it)}
venv=.venv
# --no-compile: pip byte-compiles on one core; compile_venv below does it on all of them.
install=("$venv/bin/python" -m pip --disable-pip-version-check install --quiet --no-compile)

# Every installed module byte-compiled, as pip would, on every core (half the time of pip's):
# where PYTHONDONTWRITEBYTECODE is set nothing imported is ever cached, and torch alone takes
# seconds to compile in every process. One torch test helper is Python 3.12 syntax, which pip
# skips too; any other failure stops the set-up.
compile_venv() {
  local site errors
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  errors=$("$venv/bin/python" -m compileall -q -j 0 -x 'torch/testing/_internal/py312_' \
    "$site" 2>&1) || {
    echo "error: byte-compiling $site failed: $errors" >&2
    exit 1
  }
}

# apt_install PACKAGE WHAT: Debian's PACKAGE, for WHAT was missing; exits naming both if it fails.
apt_install() {
  if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
  "${sudo[@]}" apt-get install -y -qq "$1" >/dev/null 2>&1 || {
    # Stale package lists on a fresh machine: refresh once and retry.
    "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq "$1" >/dev/null
  } || {
    echo "error: $2 is missing and apt-get could not install $1" >&2
    exit 1
  }
}

# A fresh clone takes the installed environment from the cache when one was saved for the same
# inputs (scripts/venv_template.py): its own checkout is then installed into it, nothing else.
template_key=$("$python" scripts/venv_template.py key "$python" pyproject.toml \
  scripts/setup_env.sh scripts/build_horovod.sh scripts/horovod-patches/*.patch)
restored=false
created=false
if [ ! -e "$venv" ]; then
  status=0
  "$python" scripts/venv_template.py restore "$cache_dir" "$template_key" "$venv" || status=$?
  case $status in
    0) restored=true ;;
    3) "$python" -m venv "$venv" && created=true ;;  # no template for these inputs
    *) exit 1 ;;  # it said why
  esac
elif [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"  # a broken one: made whole again by the installs below
fi
if $restored; then
  "${install[@]}" --no-deps --no-build-isolation --editable .
else
  # torch first and alone, pinned: any other order lets a dependency pull the CUDA build.
  "${install[@]}" "torch==2.13.0" "setuptools==84.2.1" "wheel==0.48.0"
  "${install[@]}" --no-build-isolation --editable ".[infra,dev]"
fi

wheel=$(scripts/build_horovod.sh "$venv/bin/python" "$cache_dir/wheels")
# horovod.torch refuses to import where the wheel was built without PyTorch ("Extension
# horovod.torch has not been built"); a second or two, where `horovodrun --check-build` takes
# seven probing every framework (tests/scripts/test_installed_horovod.py runs that).
horovod_works() { "$venv/bin/python" -c 'import horovod.torch' 2>/dev/null; }
# Installed unless this very wheel is, and works (a changed patch or torch builds another one).
horovod_ready=false
if [ "$(cat "$venv/.horovod-wheel" 2>/dev/null)" = "$wheel" ] && horovod_works; then
  horovod_ready=true
else
  "${install[@]}" --no-deps --force-reinstall "$wheel"
  echo "$wheel" >"$venv/.horovod-wheel"
fi
$restored || compile_venv
$horovod_ready || horovod_works || {
  echo "error: Horovod was built without PyTorch support; remove $cache_dir/wheels and rerun" >&2
  exit 1
}
# The region decoder for training crops (trainer/data/jpeg_region.c), built against the system's
# libjpeg-turbo. A fresh machine may lack its headers: install them and build again, which then
# shows any other failure.
scripts/build_jpeg_region.sh "$venv/bin/python" >/dev/null 2>&1 || {
  apt_install libjpeg-dev "libjpeg-turbo's headers"
  scripts/build_jpeg_region.sh "$venv/bin/python" >/dev/null
}
# Azurite, the Blob storage emulator the data-path tests run against on 127.0.0.1 (npm), installed
# once per version into the cache (half a minute of npm) and linked into the venv.
azurite_version=3.37.0
azurite="$cache_dir/azurite-$azurite_version"
if [ "$("$azurite/node_modules/.bin/azurite-blob" --version 2>/dev/null)" != "$azurite_version" ]; then
  rm -rf "$azurite.tmp" && mkdir -p "$cache_dir"
  npm install --silent --no-audit --no-fund --prefix "$azurite.tmp" "azurite@$azurite_version" || {
    echo "error: npm could not install azurite@$azurite_version (needs Node.js and npm)" >&2
    exit 1
  }
  rm -rf "$azurite" && mv "$azurite.tmp" "$azurite"
fi
rm -rf "$venv/azurite" && ln -s "$azurite" "$venv/azurite"
# `cloud-init schema` validates the NFS server's user data in the tests (Debian's package).
command -v cloud-init >/dev/null 2>&1 || apt_install cloud-init cloud-init
# Only an environment made whole by this run is saved: an updated one may hold packages that
# pyproject.toml no longer names.
! $created || "$python" scripts/venv_template.py save "$cache_dir" "$template_key" "$venv"
torch_version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')
echo "environment ready: $venv (torch $torch_version, horovod 0.28.1)"
