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


class StreamSampler(ShardSampler):
    """Shard-friendly order: each rank reads its own run of shards, shuffled by a buffer.

    Per epoch the shard order is reshuffled (seeded by seed and epoch) and the concatenated
    samples are cut into one contiguous block per rank, so a rank reads about 1/world of the
    shards, mostly sequentially. Within its block a shuffle buffer of ``buffer`` samples mixes
    the order (WebDataset's recipe). It works on indices only, so the order is known without
    reading anything and a resume skips ``skip_batches`` batches exactly.
    """

    def __init__(
        self,
        shard_samples: list[int],
        num_replicas: int,
        rank: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        buffer: int = 1000,
    ) -> None:
        super().__init__(
            sum(shard_samples), num_replicas, rank, batch_size, shuffle=shuffle, seed=seed
        )
        self.shard_starts = [sum(shard_samples[:i]) for i in range(len(shard_samples))]
        self.shard_samples = shard_samples
        self.buffer = buffer

    def rank_indices(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        shards = list(range(len(self.shard_samples)))
        if self.shuffle:
            shards = torch.randperm(len(shards), generator=generator).tolist()
        stream = [
            index
            for shard in shards
            for index in range(
                self.shard_starts[shard], self.shard_starts[shard] + self.shard_samples[shard]
            )
        ]
        block = stream[self.rank * self.per_rank : (self.rank + 1) * self.per_rank]
        if self.shuffle and self.buffer > 1:
            block = _buffer_shuffle(block, self.buffer, generator)
        start = self.skip_batches * self.batch_size
        return block[start : self.batches_per_epoch * self.batch_size]


def _buffer_shuffle(items: list[int], size: int, generator: torch.Generator) -> list[int]:
    """Stream ``items`` through a buffer of ``size``, emitting a random buffered item each time."""
    picks = torch.randint(0, 1 << 30, (len(items),), generator=generator).tolist()
    buffer: list[int] = []
    out: list[int] = []
    for item, pick in zip(items, picks, strict=True):
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = pick % size
        out.append(buffer[slot])
        buffer[slot] = item
    order = torch.randperm(len(buffer), generator=generator).tolist()
    out.extend(buffer[i] for i in order)
    return out
