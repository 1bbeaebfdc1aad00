"""Memory a node spends on the dataset cache: two DDP ranks on this host train with
``--cache decoded`` in each ``--cache-scope``, while this process watches the cache's files in
/dev/shm (tmpfs: their allocated blocks are RAM). The peak is set against one decoded copy of the
dataset, computed from the image headers as the cache computes it (a benchmark: prints, asserts
nothing).

    .venv/bin/python -m bench.cache_memory [--images 240]

One copy per rank, the design before the scopes, would be ``workers`` copies. tmpfs allocates
whole pages, so each file may hold up to 4 KiB more than its samples.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from PIL import Image

from bench.common import REPO, save, torchrun
from bench.data_path import write_dataset
from trainer.common.cli import OneLineParser
from trainer.data.cache import cached_shape
from trainer.data.node_memory import PREFIX, SHM_DIR

IMAGE_SIZE = 64
WORKERS = 2
GOAL_COPIES = 1.0  # cache memory per node, in dataset copies


def one_copy(root: Path) -> int:
    """Bytes of one decoded copy of every image under ``root`` (train and val)."""
    total = 0
    for path in root.rglob("*.JPEG"):
        with Image.open(path) as image:
            height, width = cached_shape(*image.size, IMAGE_SIZE)
        total += height * width * 3
    return total


def cache_bytes() -> int:
    """RAM held by the cache files in /dev/shm right now."""
    total = 0
    for path in SHM_DIR.glob(PREFIX + "-*"):
        with contextlib.suppress(FileNotFoundError):  # removed since listed: its run ended
            total += path.stat().st_blocks * 512
    return total


def peak_cache_bytes(scope: str, data: Path, out: Path) -> int:
    flags = [
        "--backend", "ddp", "--model", "tiny", "--data", "folder", "--data-dir", str(data),
        "--num-classes", "10", "--image-size", str(IMAGE_SIZE), "--batch-size", "8",
        "--cache", "decoded", "--cache-scope", scope, "--loader-workers", "1", "--epochs", "2",
        "--warmup-epochs", "0", "--output-dir", str(out),
    ]  # fmt: skip
    command = [*torchrun(WORKERS), "-m", "trainer", *flags]
    peak, done = 0, threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.wait(0.05):
            peak = max(peak, cache_bytes())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with open(out.parent / f"{scope}.log", "w") as log:
            result = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    finally:
        done.set()
        watcher.join()
    if result.returncode != 0:
        raise RuntimeError(f"{scope}: {' '.join(command)} failed, exit {result.returncode}")
    return peak


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--images", type=int, default=240)
    args = parser.parse_args()
    if cache_bytes():
        sys.exit(f"error: {SHM_DIR} holds cache files of another run: measure on an idle host")
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        write_dataset(root / "data", args.images)
        copy = one_copy(root / "data")
        copies = {
            scope: peak_cache_bytes(scope, root / "data", root / scope) / copy
            for scope in ("node", "rank")
        }
    print(
        f"{args.images} images 500x375, decoded at {IMAGE_SIZE} px: one copy {copy / 2**20:.2f} "
        f"MiB; {WORKERS} DDP ranks on one node"
    )
    print(f"{'scope':<8}{'copies in /dev/shm':>20}")
    for scope, ratio in copies.items():
        print(f"{scope:<8}{ratio:>20.3f}")
    print(f"{'per rank':<8}{WORKERS:>20.3f}  (before: each rank held its own copy)")
    print(
        f"goal: cache memory per node <= {GOAL_COPIES:.0f} dataset copy: node "
        f"{copies['node']:.3f}, rank {copies['rank']:.3f}"
    )
    save("cache_memory", {"images": args.images, "one_copy_bytes": copy, "copies": copies})


if __name__ == "__main__":
    main()
