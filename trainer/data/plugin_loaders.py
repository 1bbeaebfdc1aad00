"""A team's own datasets (``--data pkg.module:factory``, trainer.training.plugins) behind the same
samplers and loaders as ours: ``RankSampler`` picks each rank's part of the epoch (resumable
mid-epoch, also on another number of workers), a DataLoader batches the ``(input, target)``
samples with PyTorch's default collate, and the batches go to the device as they are."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset

from trainer.data.errors import DataError
from trainer.data.loaders import (
    DeviceLoader,
    Loaders,
    _one_line_errors,
    batch_loader,
    no_full_batch,
)
from trainer.data.sampler import RankSampler
from trainer.settings.train_config import TrainConfig


class _ByIndex(Dataset[Any]):
    """The samplers' ``(index, epoch)`` keys -> the team's ``dataset[index]``."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        return self.dataset[key[0]]


class PluginDeviceLoader(DeviceLoader):
    """(inputs, targets) batches on the device, unchanged otherwise: the team's dataset did
    its own decoding and normalization."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for inputs, targets in _one_line_errors(self.loader):
            yield inputs.to(self.device, non_blocking=True), targets.to(self.device)


def plugin_loaders(
    cfg: TrainConfig,
    train: Dataset[Any],
    val: Dataset[Any] | None,
    rank: int,
    world: int,
    device: torch.device,
) -> Loaders:
    """This rank's loaders over the plug-in's datasets (``val`` None: no evaluation)."""
    loaders: list[PluginDeviceLoader | None] = []
    for dataset, is_train in ((train, True), (val, False)):
        if dataset is None:
            loaders.append(None)
            continue
        size = len(dataset)  # type: ignore[arg-type]
        sampler = RankSampler(size, world, rank, cfg.batch_size, shuffle=is_train, seed=cfg.seed)
        if sampler.batches_per_epoch == 0:
            split = "train" if is_train else "val"
            what = f"data={cfg.data}: its {split} set's {size} samples"
            raise DataError(no_full_batch(what, sampler, "lower --batch-size"))
        workers = cfg.loader_workers
        loader = batch_loader(_ByIndex(dataset), sampler, cfg.batch_size, workers, device)
        loaders.append(PluginDeviceLoader(loader, sampler, device, channels_last=False))
    train_loader, val_loader = loaders
    assert train_loader is not None
    train_loader.stopped_together = [loader for loader in loaders if loader is not None]
    if val_loader is not None:
        val_loader.stopped_together = train_loader.stopped_together
    return Loaders(train_loader, val_loader, train_loader.sampler.batches_per_epoch)
