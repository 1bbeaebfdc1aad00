"""Which samples each rank reads, in which order: deterministic and resumable mid-epoch, also
on a different number of workers (one global order per epoch; the position is its ``offset``).
``PartSampler`` and ``StreamSampler(fixed_parts=True)`` keep each rank's part fixed for a
rank-scope cache. How and why: docs/data.md, "How it works".
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from trainer.settings.train_config import global_micro_batch

# The generator "epoch" that draws the fixed parts: no real epoch is negative.
_LAYOUT = -1


def _generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 100_003 + epoch)


class RankSampler(Sampler[tuple[int, int]]):
    """Each rank's disjoint share of a (shuffled) epoch, as ``(sample_index, epoch)`` pairs.

    The order depends only on (seed, epoch), never on a global RNG, so a run resumed at batch b
    of epoch e reads exactly what the uninterrupted run would have read. The epoch travels with
    each index so that datasets can derive per-sample augmentation randomness from it, which
    keeps augmentations identical however many loader workers there are or whether a run resumed.
    The tail that does not fill one batch of every rank is dropped so that every rank takes the same
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
        self.offset = 0
        self.layout_replicas = num_replicas

    @property
    def batches_per_epoch(self) -> int:
        """This rank's batches in a whole epoch begun on ``num_replicas`` workers."""
        return self.per_rank // self.batch_size

    @property
    def global_micro_batch(self) -> int:
        """Samples of the order one batch of every rank takes."""
        return global_micro_batch(self.batch_size, self.num_replicas)

    @property
    def order_length(self) -> int:
        """Samples in the epoch's global order (what ``offset`` counts through)."""
        return self.dataset_size

    @property
    def batches_left(self) -> int:
        """This rank's batches from ``offset`` to the end of the epoch."""
        return max(0, self.order_length - self.offset) // self.global_micro_batch

    def set_epoch(
        self,
        epoch: int,
        skip_batches: int = 0,
        *,
        offset: int | None = None,
        layout_replicas: int | None = None,
    ) -> None:
        """Select the epoch and where in it to start.

        ``offset``: samples of the epoch's global order already trained, by every rank together
        and on any number of workers. ``skip_batches`` says the same in this rank's batches at
        this world size (``offset = skip_batches * global_micro_batch``); give one or
        the other. ``layout_replicas``: the number of workers the epoch began on, where that
        differs from ``num_replicas`` (only ``StreamSampler``'s order depends on it).
        """
        if offset is not None and skip_batches:
            raise ValueError("give skip_batches or offset, not both")
        if offset is None:
            offset = min(skip_batches, self.batches_per_epoch) * self.global_micro_batch
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        self.epoch = epoch
        self.offset = offset
        self.layout_replicas = layout_replicas or self.num_replicas

    def epoch_order(self) -> list[int]:
        """The epoch's global order of sample indices."""
        if not self.shuffle:
            return list(range(self.dataset_size))
        generator = _generator(self.seed, self.epoch)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def part(self) -> list[int] | None:
        """The samples this rank reads in every epoch begun on ``num_replicas`` workers, or
        None when they change from epoch to epoch (a shuffled global order)."""
        if self.shuffle:
            return None
        return list(range(self.dataset_size))[self.rank :: self.num_replicas][
            : self.batches_per_epoch * self.batch_size
        ]

    def rank_indices(self) -> list[int]:
        """This rank's samples from ``offset`` to the end of the epoch, in order."""
        mine = self.epoch_order()[self.offset + self.rank :: self.num_replicas]
        return mine[: self.batches_left * self.batch_size]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((index, self.epoch) for index in self.rank_indices())

    def __len__(self) -> int:
        return self.batches_left * self.batch_size


class _BlockSampler(RankSampler):
    """An epoch made of one block of samples per rank, interleaved into the global order.

    The epoch's global order interleaves the blocks (rank r's m-th sample is at ``m * world +
    r``), so it depends on the number of workers the epoch began on (``layout_replicas``). On
    that number a rank computes only its own block. Resumed mid-epoch on another number, every
    rank computes all the blocks of that layout and reads its share of the rest of their
    interleaving: exact (no sample twice, none skipped but the final tail), but for the rest of
    that epoch a rank reads from every block rather than its own.
    """

    fixed_parts = False

    @property
    def order_length(self) -> int:
        # The last (dataset_size % layout) samples are in no block.
        return self.dataset_size // self.layout_replicas * self.layout_replicas

    def _blocks(self, ranks: range) -> list[list[int]]:
        """This epoch's blocks of ``ranks`` in the layout on ``layout_replicas`` workers."""
        raise NotImplementedError

    def epoch_order(self) -> list[int]:
        blocks = self._blocks(range(self.layout_replicas))
        return [index for row in zip(*blocks, strict=True) for index in row]

    def rank_indices(self) -> list[int]:
        world = self.num_replicas
        if self.layout_replicas != world or self.offset % world:
            return super().rank_indices()
        # The usual case: this rank's share of the interleaving is exactly its own block.
        (mine,) = self._blocks(range(self.rank, self.rank + 1))
        start = self.offset // world
        return mine[start : start + self.batches_left * self.batch_size]

    def part(self) -> list[int] | None:
        """The rank's whole block (any epoch on ``num_replicas`` workers) when blocks are fixed;
        each epoch reads all of it but the few its last partial batch drops."""
        if self.shuffle and not self.fixed_parts:
            return None
        layout, self.layout_replicas = self.layout_replicas, self.num_replicas
        try:
            (mine,) = self._blocks(range(self.rank, self.rank + 1))
        finally:
            self.layout_replicas = layout
        return sorted(mine)


class PartSampler(_BlockSampler):
    """Each rank a fixed part of a folder's samples, reshuffled within the part every epoch.

    The parts are contiguous runs of one permutation drawn from the seed alone (so each holds
    every class in about its share); the order within a part is a permutation drawn from
    (seed, epoch). For ``--cache-scope rank``: a rank caches its part and never reads another.
    """

    fixed_parts = True

    def _blocks(self, ranks: range) -> list[list[int]]:
        per_rank = self.dataset_size // self.layout_replicas
        if self.shuffle:
            fixed = torch.randperm(self.dataset_size, generator=_generator(self.seed, _LAYOUT))
            # One permutation of positions for every block: they hold different samples.
            within = torch.randperm(per_rank, generator=_generator(self.seed, self.epoch))
        else:
            fixed, within = torch.arange(self.dataset_size), torch.arange(per_rank)
        return [fixed[rank * per_rank : (rank + 1) * per_rank][within].tolist() for rank in ranks]


class StreamSampler(_BlockSampler):
    """Shard-friendly order: each rank reads its own run of shards, shuffled by a buffer.

    Per epoch the shard order is reshuffled (seeded by seed and epoch) and the concatenated
    samples are cut into one contiguous block per rank, so a rank reads about 1/world of the
    shards, mostly sequentially. Within its block a shuffle buffer of ``buffer`` samples mixes
    the order (WebDataset's recipe). It works on indices only, so the order is known without
    reading anything and a resume skips ``skip_batches`` batches exactly.

    ``fixed_parts`` (``--cache-scope rank``): the shard order is drawn from the seed alone, so a
    rank's run of shards is the same every epoch; each epoch reorders the run's shards and
    buffer-shuffles them, by (seed, epoch).
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
        fixed_parts: bool = False,
    ) -> None:
        super().__init__(
            sum(shard_samples), num_replicas, rank, batch_size, shuffle=shuffle, seed=seed
        )
        self.shard_starts = [sum(shard_samples[:i]) for i in range(len(shard_samples))]
        self.shard_samples = shard_samples
        self.buffer = buffer
        self.fixed_parts = fixed_parts

    def _blocks(self, ranks: range) -> list[list[int]]:
        generator = _generator(self.seed, self.epoch)
        shards = list(range(len(self.shard_samples)))
        if self.shuffle:
            layout = _generator(self.seed, _LAYOUT) if self.fixed_parts else generator
            shards = torch.randperm(len(shards), generator=layout).tolist()
        # Runs of one shard's samples, in stream order.
        stream = [
            (shard, index)
            for shard in shards
            for index in range(
                self.shard_starts[shard], self.shard_starts[shard] + self.shard_samples[shard]
            )
        ]
        per_rank = self.dataset_size // self.layout_replicas
        after_shards = generator.get_state()
        blocks = []
        for rank in ranks:
            block = stream[rank * per_rank : (rank + 1) * per_rank]
            if self.shuffle:
                # Every block is shuffled from the same generator state, as each rank does.
                generator.set_state(after_shards)
                if self.fixed_parts:
                    block = _reorder_runs(block, generator)
            indices = [index for _, index in block]
            if self.shuffle and self.buffer > 1:
                indices = _buffer_shuffle(indices, self.buffer, generator)
            blocks.append(indices)
        return blocks


def _reorder_runs(
    block: list[tuple[int, int]], generator: torch.Generator
) -> list[tuple[int, int]]:
    """``block``'s runs of one shard each, in a random order (their samples keep theirs)."""
    runs: list[list[tuple[int, int]]] = []
    for item in block:
        if runs and runs[-1][0][0] == item[0]:
            runs[-1].append(item)
        else:
            runs.append([item])
    order = torch.randperm(len(runs), generator=generator).tolist()
    return [item for k in order for item in runs[k]]


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
