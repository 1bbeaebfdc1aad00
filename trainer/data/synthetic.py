"""Synthetic images: fixed random tensors made once on the device, so no input pipeline costs
anything (Horovod's synthetic benchmark does the same). Batches are gathered from a pool by the
sampler's indices, so data order, sharding and resumption behave as with real data."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from trainer.data.sampler import RankSampler


class SyntheticLoader:
    def __init__(
        self,
        sampler: RankSampler,
        *,
        pool: int,
        image_size: int,
        num_classes: int,
        device: torch.device,
        seed: int,
        channels_last: bool = False,
    ) -> None:
        self.sampler = sampler
        generator = torch.Generator(device=device).manual_seed(seed)
        images = torch.randn(pool, 3, image_size, image_size, generator=generator, device=device)
        self.images = images.contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format
        )
        self.labels = torch.randint(0, num_classes, (pool,), generator=generator, device=device)
        self.device = device

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        self.sampler.set_epoch(epoch, skip_batches)

    def __len__(self) -> int:
        return len(self.sampler) // self.sampler.batch_size

    def stop_workers(self) -> None:
        """No worker processes: the batches are made on the device."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        indices = torch.tensor(self.sampler.rank_indices(), dtype=torch.long)
        indices = (indices % self.images.shape[0]).to(self.device)
        # One slice per batch as it is needed: split() would make every batch's view of a large
        # epoch up front, millions of them, before the first step.
        size = self.sampler.batch_size
        for start in range(0, indices.numel(), size):
            batch = indices[start : start + size]
            yield self.images.index_select(0, batch), self.labels.index_select(0, batch)
