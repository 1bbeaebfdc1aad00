"""How fast N nodes get the trainer image (a benchmark: prints and saves, asserts nothing).

    .venv/bin/python -m bench.image_pull [--nodes 1 8 64]    (root: buildah; after make image)

Measures the image `make image` built for this checkout, layer by layer: its size unpacked and
gzip-compressed as a registry stores it (``buildah push`` to an OCI folder, Docker's default
compression), how fast one core decompresses it (a node unpacks each layer on one core: pigz
cannot parallelise decompression), and which layers a trainer edit replaces (the image built
again from a copy of its inputs whose trainer/ differs by one comment line: the layers whose
content digests differ). Then models a job's pull on N nodes at once: each node downloads the
compressed layers it lacks and unpacks them; together they draw N times that from the registry.
Azure publishes no bandwidth for a Premium registry today (its SKU page lists request rates
only: 20,000 reads a minute, read 2026-11-29; the last published figure, withdrawn, was 100
MBps as a "minimum estimate"), so the model prints the registry's aggregate rate that each pull
time needs beside that former figure.

The pool prefetches the image as each node joins (infra.image.PREFETCH_TAG): the cold pull is a
node's first, paid while it joins; a job's tasks on nodes already up pull only what a trainer
edit changed (the warm column). Nodes that join for a job still pay the cold pull before it.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import REPO, save
from infra.image_inputs import IMAGE_INPUTS
from tests.support.built_image import image_name
from trainer.common.cli import OneLineParser, fail

FORMER_PREMIUM_MBPS = 100  # ACR's SKU page until 2025: Premium download bandwidth, a minimum
NODE_DOWNLOAD_MBPS = 1_000  # a node's own download: 8 Gbps of its front-end NIC, assumed
LAYERS_AT_ONCE = 3  # dockerd's and containerd's max concurrent downloads (their defaults)
BASE_REPOSITORY = "localhost/distributed-training/debian"  # scripts/build_image.sh's base


@dataclass(frozen=True)
class Layer:
    created_by: str
    compressed_mb: float
    unpacked_mb: float
    digest: str


def _buildah(*args: str) -> str:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, check=True).stdout


def layers_of(image: str, folder: Path) -> tuple[list[Layer], float]:
    """The image's layers, pushed gzip-compressed to an OCI folder; and one core's
    decompression rate over them (MB of output a second)."""
    _buildah("push", "--quiet", "--compression-format", "gzip", image, f"oci:{folder}")
    index = json.loads((folder / "index.json").read_text())
    manifest = json.loads(_blob(folder, index["manifests"][0]["digest"]).read_text())
    config = json.loads(_blob(folder, manifest["config"]["digest"]).read_text())
    history = [h for h in config.get("history", []) if not h.get("empty_layer")]
    layers, seconds, unpacked_total = [], 0.0, 0
    for entry, step in zip(manifest["layers"], history, strict=True):
        started = time.process_time()
        unpacked = 0
        with gzip.open(_blob(folder, entry["digest"]), "rb") as stream:
            while chunk := stream.read(1 << 20):
                unpacked += len(chunk)
        seconds += time.process_time() - started
        unpacked_total += unpacked
        layers.append(
            Layer(step.get("created_by", "")[-90:], entry["size"] / 1e6, unpacked / 1e6,
                  entry["digest"])
        )  # fmt: skip
    return layers, unpacked_total / 1e6 / max(seconds, 1e-9)


def _blob(folder: Path, digest: str) -> Path:
    """An OCI folder's blob (blobs/<algorithm>/<hex>)."""
    return folder / "blobs" / digest.replace(":", "/")


def edited_image(image: str, work: Path) -> str:
    """The image built again from a copy of its inputs whose trainer/ has one more comment
    line (what a trainer commit changes), with the same base and buildah's cached layers."""
    context = work / "context"
    for name in (*IMAGE_INPUTS, ".dockerignore"):
        source = REPO / name
        target = context / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    marker = context / "trainer" / "__init__.py"
    marker.write_text(marker.read_text() + "# an edit\n")
    # The base make image made and built from (scripts/build_image.sh: one Debian base image
    # under this name, replaced when it is made again).
    base = _buildah(
        "images", "--format", "{{.Name}}:{{.Tag}}", "--filter", f"reference={BASE_REPOSITORY}"
    ).split()[0]
    edited = f"{image}-edited"
    subprocess.run(
        ["buildah", "bud", "--format", "docker", "--isolation", "chroot", "--layers",
         "-f", "docker/Dockerfile", "--build-arg", f"BASE_IMAGE={base}", "-t", edited, "."],
        cwd=context, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return edited


def pull_seconds(
    mb: float, unpacked_mb: float, nodes: int, registry_mbps: float, unpack_mbps: float
) -> float:
    """One job's pull on ``nodes`` nodes at once: the download, limited by the node's own rate
    or its share of the registry's, then the unpacking of what it downloaded, ``LAYERS_AT_ONCE``
    layers on as many cores (an upper bound: Docker unpacks a layer while the next downloads)."""
    download = mb / min(NODE_DOWNLOAD_MBPS, registry_mbps / nodes)
    return download + unpacked_mb / (unpack_mbps * LAYERS_AT_ONCE)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.image_pull", description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 8, 64])
    args = parser.parse_args(argv)
    image = image_name()
    if subprocess.run(["buildah", "inspect", "--type", "image", image],
                      capture_output=True).returncode:  # fmt: skip
        fail(f"no image {image}: run `make image` first (as root)", code=1)
    with tempfile.TemporaryDirectory(prefix="image-pull-") as temp:
        work = Path(temp)
        layers, unpack_mbps = layers_of(image, work / "oci")
        started = time.monotonic()
        edited = edited_image(image, work)
        rebuild_s = time.monotonic() - started
        edited_layers, _ = layers_of(edited, work / "oci-edited")
        subprocess.run(["buildah", "rmi", edited], capture_output=True, check=False)
    before = {layer.digest for layer in layers}
    changed = [layer for layer in edited_layers if layer.digest not in before]
    total = sum(layer.compressed_mb for layer in layers)
    unpacked = sum(layer.unpacked_mb for layer in layers)
    delta = sum(layer.compressed_mb for layer in changed)
    delta_unpacked = sum(layer.unpacked_mb for layer in changed)
    print(f"{image}: {len(layers)} layers, {total:,.0f} MB compressed, {unpacked:,.0f} MB unpacked")
    for layer in layers:
        print(f"  {layer.compressed_mb:9,.1f} MB  {layer.unpacked_mb:9,.1f} MB  {layer.created_by}")
    print(f"a trainer edit replaces {len(changed)} layers: {delta:,.1f} MB compressed "
          f"({delta_unpacked:,.1f} MB unpacked); rebuilt here in {rebuild_s:.0f} s")  # fmt: skip
    print(f"one core decompresses {unpack_mbps:,.0f} MB/s of layer output")
    rows = []
    print("nodes  registry MB/s  cold pull (a node's first, as it joins)  "
          "warm pull (a job's start after a trainer edit)")  # fmt: skip
    for nodes in args.nodes:
        for rate in (FORMER_PREMIUM_MBPS, 1_000, 10_000):
            cold = pull_seconds(total, unpacked, nodes, rate, unpack_mbps)
            warm = pull_seconds(delta, delta_unpacked, nodes, rate, unpack_mbps)
            rows.append({"nodes": nodes, "registry_mbps": rate, "cold_s": cold, "warm_s": warm})
            print(f"{nodes:5d}  {rate:13,d}  {cold:38,.0f} s  {warm:7,.1f} s")
    save("image_pull", {
        "image": image, "layers": [asdict(layer) for layer in layers],
        "changed_by_trainer_edit": [asdict(layer) for layer in changed],
        "unpack_mbps_one_core": unpack_mbps, "rebuild_after_trainer_edit_s": rebuild_s,
        "model": rows,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
