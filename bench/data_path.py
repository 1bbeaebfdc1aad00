"""Input pipeline speed: images/sec decoded and augmented on one core for an image folder,
prepared shards (as stored by default and scaled down to a 256 px short side), and the two
memory caches, on the same generated dataset (a benchmark: prints, asserts nothing).

    .venv/bin/python -m bench.data_path [--images 600] [--image-size 224]

The dataset is ImageNet-like: 500x375 JPEGs (quality 90) of smooth random scenes. Every mode
runs training epochs (RandomResizedCrop + flip) in this process, in turns over 5 rounds (the
median counts); the caches are filled first and their fill time is reported apart. The
baseline is the folder path as it was when the 2.5x goal was set ("folder before": Pillow's
decode, a copy of its pixels into a new array, and the sample copied into (3, H, W) memory);
"Pillow folder" is today's path with Pillow's decode, the decoder's share of the gain. The
per-GPU budget compares each path's rate per core with what one GPU of an ND H100 v5 node
consumes, from the vCPUs it has beside it.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate

from bench.common import save
from bench.gpu import H100_TARGET
from infra.sizes import size_of
from trainer.common.cli import OneLineParser
from trainer.data.cache import MemoryCache, load_pixels
from trainer.data.dataset import CheckedImageDataset, ImageDataset, collate_images
from trainer.data.decode import decode, decode_pixels_pil
from trainer.data.folder import FolderSource
from trainer.data.loaders import batch_loader
from trainer.data.prepare import prepare
from trainer.data.sampler import RankSampler
from trainer.data.shards import ShardSource
from trainer.data.transforms import ChooseBox, crop_of
from trainer.launch.node_sizes import fabric_for

BUDGET_SIZE = "Standard_ND96isr_H100_v5"
# What this path is held to: images/s per core against the folder path before.
GOAL_SPEEDUP = 2.5
ROUNDS = 5
SCALED_SHORT_SIDE = 256  # as fast loaders (FFCV) store ImageNet; loses detail in small crops
LOADER_BATCH = 64


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
    """``ImageDataset``'s training path with every image decoded whole, by Pillow."""

    def __init__(self, source: FolderSource, image_size: int) -> None:
        super().__init__(source, image_size, train=True, seed=0)

    def pixels(self, index: int) -> torch.Tensor:
        return decode_pixels_pil(self.source.read(index), self.source.describe(index))

    def crop(self, index: int, choose_box: ChooseBox) -> torch.Tensor:
        return crop_of(self.pixels(index), choose_box)


class WholeImages(ImageDataset):
    """Today's training path, but each JPEG decoded whole before it is cropped: beside the same
    source read normally, the gain of decoding only the crop's region (``jpeg_region``)."""

    def crop(self, index: int, choose_box: ChooseBox) -> torch.Tensor:
        return crop_of(load_pixels(self.source, index), choose_box)


class FolderBefore(PillowFolder):
    """The baseline: the folder path when the goal was set. Pillow's pixels were copied into a
    new array, and each augmented sample into (3, H, W) memory: a transposing copy, as the
    resize answers in (H, W, 3) memory (batches are NHWC now, ``collate_images``, filled with
    plain row copies). The copy into the batch, one per sample in both, is counted in neither."""

    def pixels(self, index: int) -> torch.Tensor:
        image = decode(self.source.read(index), self.source.describe(index))
        return torch.from_numpy(np.array(image, dtype=np.uint8, copy=True))

    def sample(self, index: int, epoch: int) -> tuple[torch.Tensor, int]:
        image, label = super().sample(index, epoch)
        return image.contiguous(), label


class CpuStamped:
    """A collate function that also returns the CPU seconds its process has used: consecutive
    batches of a one-worker loader give that worker's CPU per sample."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, samples: list[Any]) -> tuple[Any, float]:
        return self.collate(samples), time.process_time()


def worker_cpu_per_sample(dataset: Dataset, collate: Callable[[list[Any]], Any]) -> list[float]:
    """Seconds of a loader worker's CPU per sample, one figure per round: the trainer's own
    DataLoader (forkserver worker, prefetching) with one worker, so what it measures includes
    the collate and the batch's trip to shared memory."""
    sampler = RankSampler(len(dataset), 1, 0, LOADER_BATCH, shuffle=True, seed=0)
    loader = batch_loader(
        dataset, sampler, LOADER_BATCH, 1, torch.device("cpu"), CpuStamped(collate)
    )
    figures = []
    for epoch in range(ROUNDS + 1):  # the first one starts the worker
        sampler.set_epoch(epoch)
        stamps = [stamp for _, stamp in loader]
        figures.append((stamps[-1] - stamps[0]) / ((len(stamps) - 1) * LOADER_BATCH))
    return figures[1:]


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
        datasets: dict[str, Dataset] = {
            "folder_before": FolderBefore(folder, image_size),
            "folder_pillow": PillowFolder(folder, image_size),
        }
        for name, source in sources.items():
            datasets[name] = ImageDataset(source, image_size, train=True, seed=0)
        datasets["shards_whole"] = WholeImages(sources["shards"], image_size, train=True, seed=0)
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
        # The loader worker's whole cost per sample, the folder path then and now.
        results["worker_cpu_ms_per_sample"] = {
            name: 1000 * statistics.median(worker_cpu_per_sample(dataset, collate))
            for name, dataset, collate in (
                ("folder_before", FolderBefore(folder, image_size), default_collate),
                (
                    "folder",
                    CheckedImageDataset(folder, image_size, train=True, seed=0),
                    collate_images,
                ),
            )
        }
        results["images_per_sec"] = rates
        results["speedup_vs_folder"] = {k: v / rates["folder_before"] for k, v in rates.items()}
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
        f"{'source':<16}{'images/s':>10}{'vs folder before':>18}"
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
        f">= {GOAL_SPEEDUP}x the folder before, per core: "
        f"shards at {SCALED_SHORT_SIDE} px {speedup[f'shards_{SCALED_SHORT_SIDE}']:.2f}x, "
        f"shards as stored by default {speedup['shards']:.2f}x"
    )
    print(
        "decoding only the crop's region: "
        f"{results['images_per_sec']['shards'] / results['images_per_sec']['shards_whole']:.2f}x "
        "the same shards decoded whole"
    )
    worker = results["worker_cpu_ms_per_sample"]
    print(
        f"a loader worker's CPU per sample (folder, batches of {LOADER_BATCH}, collate included): "
        f"before {worker['folder_before']:.2f} ms, now {worker['folder']:.2f} ms "
        f"({worker['folder_before'] / worker['folder']:.2f}x)"
    )
    for mode in ("bytes", "decoded"):
        print(
            f"cache={mode}: {results[f'cache_{mode}_mb']:.1f} MB in RAM, "
            f"filled in {results[f'cache_{mode}_fill_s']:.2f} s"
        )
    save("data_path", results)


if __name__ == "__main__":
    main()
