"""Input pipeline speed: images/sec decoded and augmented on one core for an image folder,
prepared shards, and the two memory caches, on the same generated dataset (a benchmark: prints,
asserts nothing).

    .venv/bin/python -m bench.data_path [--images 600] [--image-size 224]

The dataset is ImageNet-like: 500x375 JPEGs (quality 90) of smooth random scenes. Every mode
runs one training epoch (RandomResizedCrop + flip + normalize) through the same dataset class
in this process; the caches are filled first and their fill time is reported apart.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bench.common import save
from trainer.cli import OneLineParser
from trainer.data.cache import MemoryCache
from trainer.data.dataset import ImageDataset
from trainer.data.folder import FolderSource
from trainer.data.prepare import prepare
from trainer.data.shards import ShardSource


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


def epoch_rate(dataset: ImageDataset) -> float:
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
        sources = {
            "folder": FolderSource(root / "src" / "train"),
            "shards": ShardSource(root / "shards", "train"),
        }
        results = {"images": images, "image_size": image_size, "dataset_mb": size / 2**20}
        rates = {}
        for name, source in sources.items():
            rates[name] = epoch_rate(ImageDataset(source, image_size, train=True, seed=0))
        for mode in ("bytes", "decoded"):
            started = time.perf_counter()
            cache = MemoryCache(sources["shards"], mode, image_size, workers=0)
            results[f"cache_{mode}_fill_s"] = time.perf_counter() - started
            results[f"cache_{mode}_mb"] = cache.data.numel() / 2**20
            rates[f"cache_{mode}"] = epoch_rate(ImageDataset(cache, image_size, train=True, seed=0))
        results["images_per_sec"] = rates
        results["speedup_vs_folder"] = {k: v / rates["folder"] for k, v in rates.items()}
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
    print(f"{'source':<16}{'images/s':>10}{'vs folder':>11}")
    for name, rate in results["images_per_sec"].items():
        print(f"{name:<16}{rate:>10.1f}{results['speedup_vs_folder'][name]:>10.2f}x")
    for mode in ("bytes", "decoded"):
        print(
            f"cache={mode}: {results[f'cache_{mode}_mb']:.1f} MB in RAM, "
            f"filled in {results[f'cache_{mode}_fill_s']:.2f} s"
        )
    save("data_path", results)


if __name__ == "__main__":
    main()
