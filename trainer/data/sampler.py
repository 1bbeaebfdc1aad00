"""Which samples each rank reads, in which order: deterministic and resumable mid-epoch."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ShardSampler(Sampler[tuple[int, int]]):
    """Each rank's disjoint share of a (shuffled) epoch, as ``(sample_index, epoch)`` pairs.

    The order depends only on (seed, epoch), never on a global RNG, so a run resumed at batch b
    of epoch e reads exactly what the uninterrupted run would have read. The epoch travels with
    each index so that datasets can derive per-sample augmentation randomness from it, which
    keeps augmentations identical however many loader workers there are or whether a run resumed.
    The tail that does not divide evenly among ranks is dropped so that every rank takes the same
    number of steps (a rank with one batch more would wait forever in an allreduce).
    """

    def __init__(
        self,
        dataset_size: int,
        num_replicas: int,
        rank: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} outside 0..{num_replicas - 1}")
        self.dataset_size = dataset_size
        self.num_replicas = num_replicas
        self.rank = rank
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.per_rank = dataset_size // num_replicas
        self.epoch = 0
        self.skip_batches = 0

    @property
    def batches_per_epoch(self) -> int:
        return self.per_rank // self.batch_size

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Select the epoch, optionally starting after ``skip_batches`` already-trained batches."""
        self.epoch = epoch
        self.skip_batches = min(skip_batches, self.batches_per_epoch)

    def rank_indices(self) -> list[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.dataset_size, generator=generator).tolist()
        else:
            order = list(range(self.dataset_size))
        used = order[: self.per_rank * self.num_replicas]
        mine = used[self.rank :: self.num_replicas]
        start = self.skip_batches * self.batch_size
        return mine[start : self.batches_per_epoch * self.batch_size]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((index, self.epoch) for index in self.rank_indices())

    def __len__(self) -> int:
        return (self.batches_per_epoch - self.skip_batches) * self.batch_size
