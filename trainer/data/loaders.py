"""``build_loaders``: the train and validation batches for one rank, on its device."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch.utils.data import DataLoader

from trainer.config import TrainConfig
from trainer.data.folder import DataError, ImageFolderDataset
from trainer.data.sampler import ShardSampler
from trainer.data.synthetic import SyntheticLoader


class Loader(Protocol):
    """Batches of (images, labels) already on the device; ``len`` counts batches left."""

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


@dataclass
class Loaders:
    train: Loader
    val: Loader | None
    batches_per_epoch: int


class DeviceLoader:
    """A DataLoader over a ``ShardSampler`` that hands out batches on the device."""

    def __init__(
        self, loader: DataLoader, sampler: ShardSampler, device: torch.device, channels_last: bool
    ) -> None:
        self.loader, self.sampler, self.device = loader, sampler, device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        self.sampler.set_epoch(epoch, skip_batches)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in self.loader:
            images = images.to(self.device, non_blocking=True, memory_format=self.memory_format)
            yield images, labels.to(self.device, non_blocking=True)


def _folder_loader(
    dataset: ImageFolderDataset,
    cfg: TrainConfig,
    rank: int,
    world: int,
    device: torch.device,
    channels_last: bool,
    shuffle: bool,
) -> DeviceLoader:
    sampler = ShardSampler(
        len(dataset), world, rank, cfg.batch_size, shuffle=shuffle, seed=cfg.seed
    )
    if sampler.batches_per_epoch == 0:
        raise DataError(
            f"{len(dataset)} images in {dataset.root} give no full "
            f"batch of {cfg.batch_size} per worker for {world} workers: lower --batch-size"
        )
    workers = cfg.loader_workers
    loader = DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        # InfiniBand verbs and CUDA are not fork-safe: start workers from a clean server process.
        multiprocessing_context="forkserver" if workers else None,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers else None,
    )
    return DeviceLoader(loader, sampler, device, channels_last)


def build_loaders(
    cfg: TrainConfig, rank: int, world: int, device: torch.device, channels_last: bool
) -> Loaders:
    """Loaders for this rank's shard. Raises ``DataError`` for unusable data."""
    if cfg.data == "synthetic":
        sampler = ShardSampler(cfg.synthetic_size, world, rank, cfg.batch_size, seed=cfg.seed)
        if sampler.batches_per_epoch == 0:
            raise DataError(
                f"synthetic_size={cfg.synthetic_size}: gives no full batch of {cfg.batch_size} "
                f"per worker for {world} workers: raise it to at least {cfg.batch_size * world}"
            )
        common = dict(
            image_size=cfg.image_size,
            num_classes=cfg.num_classes,
            device=device,
            channels_last=channels_last,
        )
        train = SyntheticLoader(sampler, pool=cfg.synthetic_pool, seed=cfg.seed, **common)
        val_sampler = ShardSampler(
            max(cfg.synthetic_pool, cfg.batch_size * world),
            world,
            rank,
            cfg.batch_size,
            shuffle=False,
        )
        val = SyntheticLoader(val_sampler, pool=cfg.synthetic_pool, seed=cfg.seed + 1, **common)
        return Loaders(train, val, sampler.batches_per_epoch)

    root = Path(cfg.data_dir or "")
    train_set = ImageFolderDataset(root / "train", cfg.image_size, train=True, seed=cfg.seed)
    if len(train_set.classes) > cfg.num_classes:
        raise DataError(
            f"num_classes={cfg.num_classes}: {root / 'train'} has {len(train_set.classes)} "
            f"classes; set --num-classes {len(train_set.classes)}"
        )
    train = _folder_loader(train_set, cfg, rank, world, device, channels_last, shuffle=True)
    val = None
    if (root / "val").is_dir():
        val_set = ImageFolderDataset(root / "val", cfg.image_size, train=False, seed=cfg.seed)
        if val_set.classes != train_set.classes:
            raise DataError(f"{root / 'val'}: class folders differ from {root / 'train'}")
        val = _folder_loader(val_set, cfg, rank, world, device, channels_last, shuffle=False)
    return Loaders(train, val, train.sampler.batches_per_epoch)
