"""Input pipeline speed: images/sec decoded and augmented on one core for an image folder,
prepared shards (as stored by default and scaled down to a 256 px short side), and the two
memory caches, on the same generated dataset (a benchmark: prints, asserts nothing).

    .venv/bin/python -m bench.data_path [--images 600] [--image-size 224]

The dataset is ImageNet-like: 500x375 JPEGs (quality 90) of smooth random scenes. Every mode
runs training epochs (RandomResizedCrop + flip) in this process, in turns over 5 rounds (the
median counts); the caches are filled first and their fill time is reported apart. The
baseline is the folder decoded by Pillow alone (the path before libjpeg-turbo's direct
decode). The per-GPU budget compares each path's rate per core with what one GPU of an ND H100
v5 node consumes, from the vCPUs it has beside it.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from bench.common import save
from bench.gpu import H100_TARGET
from infra.sizes import size_of
from trainer.cli import OneLineParser
from trainer.data.cache import MemoryCache
from trainer.data.dataset import ImageDataset
from trainer.data.decode import decode_pixels_pil
from trainer.data.folder import FolderSource
from trainer.data.prepare import prepare
from trainer.data.shards import ShardSource
from trainer.launch.fabric import fabric_for

BUDGET_SIZE = "Standard_ND96isr_H100_v5"
# What this path is held to: images/s per core against the Pillow folder path.
GOAL_SPEEDUP = 2.5
ROUNDS = 5
SCALED_SHORT_SIDE = 256  # as fast loaders (FFCV) store ImageNet; loses detail in small crops


def write_dataset(root: Path, images: int, classes: int = 10) -> int:
    """Smooth scenes (upsampled noise plus grain): JPEG sizes close to ImageNet's ~110 KB."""
    rng = np.random.default_rng(0)
    total = 0
    for index in range(images):
        folder = root / "train" / f"n{index % classes:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        coarse = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((500, 375), Image.Resampling.BICUBIC)
        grain = rng.integers(-12, 12, (375, 500, 3))
        pixels = np.clip(np.asarray(image, dtype=np.int16) + grain, 0, 255).astype(np.uint8)
        path = folder / f"img{index:06d}.JPEG"
        Image.fromarray(pixels).save(path, quality=90)
        total += path.stat().st_size
    return total


class PillowFolder(ImageDataset):
    """The baseline: ``ImageDataset``'s training path with every image decoded by Pillow."""

    def __init__(self, source: FolderSource, image_size: int) -> None:
        super().__init__(source, image_size, train=True, seed=0)

    def pixels(self, index: int) -> torch.Tensor:
        return decode_pixels_pil(self.source.read(index), self.source.describe(index))


def epoch_rate(dataset: Dataset) -> float:
    torch.set_num_threads(1)
    started = time.perf_counter()
    for index in range(len(dataset)):
        dataset[(index, 0)]
    return len(dataset) / (time.perf_counter() - started)


def run(images: int, image_size: int) -> dict:
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        size = write_dataset(root / "src", images)
        prepare(root / "src", root / "shards", log=lambda _: None)
        scaled = f"shards_{SCALED_SHORT_SIDE}"
        prepare(root / "src", root / scaled, max_short_side=SCALED_SHORT_SIDE, log=lambda _: None)
        folder = FolderSource(root / "src" / "train")
        sources = {
            "folder": folder,
            "shards": ShardSource(root / "shards", "train"),
            scaled: ShardSource(root / scaled, "train"),
        }
        results = {"images": images, "image_size": image_size, "dataset_mb": size / 2**20}
        datasets: dict[str, Dataset] = {"folder_pillow": PillowFolder(folder, image_size)}
        for name, source in sources.items():
            datasets[name] = ImageDataset(source, image_size, train=True, seed=0)
        for mode in ("bytes", "decoded"):
            started = time.perf_counter()
            cache = MemoryCache(sources["shards"], mode, image_size, workers=0)
            results[f"cache_{mode}_fill_s"] = time.perf_counter() - started
            results[f"cache_{mode}_mb"] = cache.data.numel() / 2**20
            datasets[f"cache_{mode}"] = ImageDataset(cache, image_size, train=True, seed=0)
        # Modes take turns, round after round, and each keeps its median: a slow spell of this
        # shared machine then falls on every mode alike instead of on whichever ran in it.
        samples: dict[str, list[float]] = {name: [] for name in datasets}
        for _ in range(ROUNDS):
            for name, dataset in datasets.items():
                samples[name].append(epoch_rate(dataset))
        rates = {name: statistics.median(values) for name, values in samples.items()}
        results["images_per_sec"] = rates
        results["speedup_vs_folder"] = {k: v / rates["folder_pillow"] for k, v in rates.items()}
        fabric, vm = fabric_for(BUDGET_SIZE), size_of(BUDGET_SIZE)
        results["budget"] = {
            "vm_size": BUDGET_SIZE,
            "images_per_sec_per_gpu": H100_TARGET,
            "vcpus_per_gpu": vm.vcpus / fabric.gpus,
            "needed_per_vcpu": H100_TARGET / (vm.vcpus / fabric.gpus),
        }
        return results


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args()
    results = run(args.images, args.image_size)
    print(
        f"{args.images} JPEGs 500x375 ({results['dataset_mb']:.1f} MB), {args.image_size} px "
        f"crops, one core"
    )
    budget = results["budget"]
    print(
        f"{'source':<16}{'images/s':>10}{'vs Pillow folder':>18}"
        f"{'cores per GPU':>15} (an {budget['vm_size']} GPU: {budget['vcpus_per_gpu']:.0f} vCPUs, "
        f"{budget['images_per_sec_per_gpu']} images/s)"
    )
    for name, rate in results["images_per_sec"].items():
        print(
            f"{name:<16}{rate:>10.1f}{results['speedup_vs_folder'][name]:>17.2f}x"
            f"{budget['images_per_sec_per_gpu'] / rate:>15.1f}"
        )
    speedup = results["speedup_vs_folder"]
    print(
        f"budget: {budget['needed_per_vcpu']:.0f} images/s per vCPU needed; goal "
        f">= {GOAL_SPEEDUP}x the Pillow folder per core: "
        f"shards at {SCALED_SHORT_SIDE} px {speedup[f'shards_{SCALED_SHORT_SIDE}']:.2f}x, "
        f"shards as stored by default {speedup['shards']:.2f}x"
    )
    for mode in ("bytes", "decoded"):
        print(
            f"cache={mode}: {results[f'cache_{mode}_mb']:.1f} MB in RAM, "
            f"filled in {results[f'cache_{mode}_fill_s']:.2f} s"
        )
    save("data_path", results)


if __name__ == "__main__":
    main()
