#!/usr/bin/env bash
# make image: build docker/Dockerfile here as ACR Tasks builds it for a stack (the same stages,
# the same BASE_IMAGE argument, the builder stage's Horovod build and the image's smoke test),
# without a Docker engine, and tag it with the stack's content tag (infra/image_inputs.py).
#
# - Tools: Debian's buildah, which builds a Dockerfile as root (--isolation chroot) in Docker's
#   image format (SHELL, which the Dockerfile uses, exists only there), and mmdebstrap; both are
#   installed with apt when missing.
# - The base: ACR pulls the Dockerfile's default base (a Debian release's slim image, pinned by
#   digest in the stack). A public container registry is not reachable from every machine that
#   builds here, so the same release is made with mmdebstrap from Debian's archive (its minbase
#   variant: the packages the slim image is made of) and imported. It trusts the certificate
#   authorities this machine trusts (/usr/local/share/ca-certificates), so that its RUN steps
#   reach the package registries wherever this machine does, through a TLS-inspecting proxy
#   too; an image built here is never pushed.
# - Cache: an image whose tag (the inputs' content hash) exists is not built again; else
#   buildah's layers (its own storage, outside the checkout: an unchanged step is not run
#   again), and the base under CACHE_DIR/image, made again after a week (security updates) by
#   the next build.
#
# Usage: scripts/build_image.sh CACHE_DIR. Prints the image's reference; build output goes to
# stderr. Exit 1 when this machine cannot build (not root, or the tools cannot be installed).
set -euo pipefail
cd "$(dirname "$0")/.."

cache_dir=${1:?usage: build_image.sh CACHE_DIR}
fail() { echo "make image: $*" >&2; exit 1; }

# The Dockerfile's default base names the release: ARG BASE_IMAGE=debian:<release>-slim.
base_default=$(sed -n 's/^ARG BASE_IMAGE=//p' docker/Dockerfile)
release=$(sed -n 's/^debian:\([a-z0-9.]*\)-slim$/\1/p' <<<"$base_default")
[ -n "$release" ] || fail "docker/Dockerfile: ARG BASE_IMAGE=$base_default is not a debian:<release>-slim image; this script makes only those"
# Debian's archive names releases by code name; the image's tag may give the number.
case "$release" in
  13) suite=trixie ;;
  12) suite=bookworm ;;
  *) suite=$release ;;
esac

if ! command -v buildah >/dev/null || ! command -v mmdebstrap >/dev/null; then
  [ "$(id -u)" -eq 0 ] || fail "buildah and mmdebstrap are missing; run as root to install them with apt"
  # netavark: buildah's network backend, which Debian lists only as a recommendation.
  apt-get install -y --no-install-recommends buildah mmdebstrap netavark >&2 \
    || fail "apt-get could not install buildah, mmdebstrap and netavark"
fi
[ "$(id -u)" -eq 0 ] || fail "buildah builds with --isolation chroot as root only; run make image as root"

# The tag is the content hash of every input of the image (infra/image_inputs.py): an image
# with it is this checkout's image, built already, and make test runs this on every call.
tag=$(.venv/bin/python -c 'from infra.image_inputs import content_tag; print(content_tag())')
image="localhost/distributed-training/trainer:$tag"
if buildah inspect --type image "$image" >/dev/null 2>&1; then
  echo "make image: $image is built already" >&2
  echo "$image"
  exit 0
fi

base_dir="$cache_dir/image"
mkdir -p "$base_dir"
certificates=$(cat /usr/local/share/ca-certificates/*.crt 2>/dev/null | sha256sum | cut -c1-12)
rootfs="$base_dir/debian-$suite-minbase-$certificates.tar"
base="localhost/distributed-training/debian:$suite-$certificates"
# Nothing half-made stays behind: a root file system being written, a container being filled.
container=
cleanup() {
  rm -f "$rootfs.tmp"
  [ -z "$container" ] || buildah rm "$container" >/dev/null 2>&1 || true
}
trap cleanup EXIT
if [ -z "$(find "$rootfs" -mtime -7 2>/dev/null)" ]; then
  rm -f "$base_dir"/debian-"$suite"-minbase-*.tar
  # shellcheck disable=SC2016  # $1 is mmdebstrap's, the root being made
  mmdebstrap --variant=minbase --include=ca-certificates \
    --customize-hook='for c in /usr/local/share/ca-certificates/*.crt; do [ ! -e "$c" ] || cp "$c" "$1/usr/local/share/ca-certificates/"; done; chroot "$1" update-ca-certificates' \
    "$suite" "$rootfs.tmp" http://deb.debian.org/debian >&2
  mv "$rootfs.tmp" "$rootfs"
  buildah rmi "$base" >/dev/null 2>&1 || true
fi
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  container=$(buildah from scratch)
  buildah add "$container" "$rootfs" / >/dev/null
  buildah config --cmd '["bash"]' "$container"
  buildah commit --quiet "$container" "$base" >/dev/null
fi

buildah bud --format docker --isolation chroot --layers -f docker/Dockerfile \
  --build-arg "BASE_IMAGE=$base" -t "$image" . >&2
echo "$image"
