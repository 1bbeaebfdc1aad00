"""In-memory caches: read (and decode) every sample once, serve later epochs from RAM.

``bytes`` keeps the encoded files, ``decoded`` the pixels at the size the transforms use; both
live in shared memory, one copy per node (``--cache-scope node``) or each rank its part
(``rank``). How they fill and why: docs/data.md, "How it works".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from trainer.data.bad_images import BadImages
from trainer.data.decode import decode_crop, decode_pixels, image_size
from trainer.data.errors import DataError
from trainer.data.node_memory import NodeGroup, Segment, free_bytes, own_prefix, split
from trainer.data.transforms import ChooseBox, crop_of, eval_resize, resize, short_side_shape
from trainer.data.worker_processes import forkserver

log = logging.getLogger(__name__)


class Source(Protocol):
    def __len__(self) -> int: ...
    def label(self, index: int) -> int: ...
    def describe(self, index: int) -> str: ...
    def encoded_size(self, index: int) -> int: ...
    def read(self, index: int) -> bytes: ...


def cached_shape(width: int, height: int, image_size: int) -> tuple[int, int]:
    """(height, width) after scaling the short side down to ``image_size * 256 / 224``
    (never up: small images are kept as they are)."""
    short = eval_resize(image_size)
    if min(width, height) <= short:
        return height, width
    return short_side_shape(width, height, short)


def _downscaled(
    source: Source, index: int, shape: tuple[int, int] | None, size: int
) -> torch.Tensor:
    """The (height, width, 3) pixels a decoded cache holds for ``index``."""
    pixels = decode_pixels(source.read(index), source.describe(index))
    if shape is None:
        shape = cached_shape(pixels.shape[1], pixels.shape[0], size)
    if shape != pixels.shape[:2]:
        pixels = resize(pixels, *shape).permute(1, 2, 0)
    return pixels


# The fill passes run in loader workers, where a raised error would reach this process as a
# multi-line report: they return (value, problem) instead, "" when the sample decoded.
class _Header(Dataset[tuple[tuple[int, int], str]]):
    def __init__(self, source: Source, indices: Sequence[int]) -> None:
        self.source, self.indices = source, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> tuple[tuple[int, int], str]:
        index = self.indices[position]
        try:
            return image_size(self.source.read(index), self.source.describe(index)), ""
        except DataError as err:
            return (0, 0), str(err)  # cached as nothing: training replaces the sample


class _Decode(Dataset[tuple[torch.Tensor, str]]):
    def __init__(self, source: Source, indices: Sequence[int], shapes: np.ndarray, size: int):
        self.source, self.indices, self.shapes, self.size = source, indices, shapes, size

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> tuple[torch.Tensor, str]:
        height, width = (int(v) for v in self.shapes[position])
        index = self.indices[position]
        try:
            return _downscaled(self.source, index, (height, width), self.size).flatten(), ""
        except DataError as err:
            return torch.empty(0, dtype=torch.uint8), str(err)


class _Read(Dataset[tuple[torch.Tensor, str]]):
    def __init__(self, source: Source, indices: Sequence[int]) -> None:
        self.source, self.indices = source, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> tuple[torch.Tensor, str]:
        data = bytearray(self.source.read(self.indices[position]))
        return torch.frombuffer(data, dtype=torch.uint8), ""  # decoded only when trained on


def _each(dataset: Dataset, workers: int) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context=forkserver() if workers else None,
        # Its own generator: iterating must not draw from the global RNG, which seeds the model.
        generator=torch.Generator().manual_seed(0),
    )


def _memory_error(need: int, copies: str, mode: str, count: int, group: NodeGroup) -> str | None:
    """Why ``need`` bytes cannot be cached on this node, or None."""
    free = psutil.virtual_memory().available
    if need > 0.9 * free:
        return (
            f"cache={mode}: {count} images need {need / 2**30:.1f} GiB ({copies}) but "
            f"{free / 2**30:.1f} GiB is free: use --cache bytes or --cache none"
        )
    shm = free_bytes(group.directory)
    if need > shm:
        return (
            f"cache={mode}: {count} images need {need / 2**30:.1f} GiB ({copies}) but "
            f"{group.directory} has {shm / 2**30:.1f} GiB free: give the container more shared "
            "memory (--shm-size, --ipc=host) or use --cache bytes or --cache none"
        )
    return None


def _node_need(total: int, shared: bool, group: NodeGroup, ranks_per_node: int) -> tuple[int, str]:
    """What the node will hold (bytes, and which copies), checked before anything is allocated."""
    if shared:
        return total, f"one copy for the node's {group.size} rank(s)"
    if group.dist is not None:
        return sum(group.gather(total)), f"the parts of the node's {group.size} ranks"
    return total * ranks_per_node, f"{ranks_per_node} rank(s), each its part"


class MemoryCache:
    """A ``Source`` (and, when decoded, an image store) held in shared memory.

    ``indices`` None (node scope): every sample, one copy shared by ``group``'s ranks, each
    filling its run of the samples. ``indices`` given (rank scope): only those samples, in a
    segment of this rank's own; ``group`` then only makes the memory check count the parts of
    all the node's ranks (without it: this part times ``ranks_per_node``). Without ``group`` this
    process is alone on its node (benchmarks, one-process use).

    An image that does not decode while a decoded cache fills stops every rank with one line
    (``bad_images``' fix), unless ``bad_images`` skips: then it is recorded in ``bad`` and
    ``pixels`` raises for it, so training replaces it as it would without a cache.
    """

    def __init__(
        self,
        source: Source,
        mode: str,
        image_size: int,
        workers: int,
        ranks_per_node: int = 1,
        *,
        group: NodeGroup | None = None,
        indices: Sequence[int] | None = None,
        name: str = "train",
        bad_images: BadImages | None = None,
    ) -> None:
        if mode not in ("bytes", "decoded"):
            raise ValueError(f"cache mode {mode!r}")
        self.source, self.mode, self.image_size = source, mode, image_size
        self.bad_images = bad_images or BadImages()
        # Samples that did not decode while filling, with why (every rank's, node scope).
        self.bad: dict[int, str] = {}
        shared = indices is None
        group = group or NodeGroup.alone()
        cached, mine = self._place(indices, group)
        filled = cached[mine.start : mine.stop]
        shapes_part = self._measure(filled, shared, group, workers)
        total = int(self.offsets[-1])
        need, copies = _node_need(total, shared, group, ranks_per_node)

        self.segment: Segment | None = None
        try:
            self._allocate(shared, group, name, total, need, copies)
            assert self.segment is not None
            self.data = self.segment.tensor
            mine_bytes = int(self.offsets[mine.stop]) - int(self.offsets[mine.start])
            log.info(
                "cache=%s: filling %.2f GiB for %d of %d images (%s)",
                mode,
                mine_bytes / 2**30,
                len(filled),
                len(source),
                copies,
            )
            # Every run is written before any rank reads (the group's last exchange).
            group.first_error(self._fill(filled, mine, shapes_part, workers))
            if shared:
                self.bad = {k: v for part in group.gather(self.bad) for k, v in part.items()}
        except BaseException:
            if self.segment is not None:
                self.segment.close()
            raise

    def _place(self, indices: Sequence[int] | None, group: NodeGroup) -> tuple[list[int], range]:
        """The samples cached, in slot order, and the slots this rank fills; sets ``slots``."""
        count = len(self.source)
        if indices is None:
            cached = list(range(count))
            mine = split(count, group.size)[group.position]
        else:
            cached = sorted(set(indices))
            mine = range(len(cached))
        # slot[index]: the sample's position in the cache, -1 when it is not cached.
        self.slots = np.full(count, -1, dtype=np.int64)
        self.slots[cached] = np.arange(len(cached), dtype=np.int64)
        return cached, mine

    def _measure(
        self, filled: list[int], shared: bool, group: NodeGroup, workers: int
    ) -> np.ndarray | None:
        """Sets ``shapes`` and ``offsets``: each rank measures its run, a node cache's ranks
        exchange theirs. Returns this rank's run's shapes (None for bytes)."""
        part, shapes_part, error = self._measure_run(filled, workers)
        group.first_error(error)
        if shared:
            every = group.gather((part, shapes_part))
            sizes = np.concatenate([p for p, _ in every]).astype(np.int64)
            self.shapes = None if self.mode == "bytes" else np.concatenate([s for _, s in every])
        else:
            sizes, self.shapes = part, shapes_part
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return shapes_part

    def _measure_run(
        self, filled: list[int], workers: int
    ) -> tuple[np.ndarray, np.ndarray | None, str | None]:
        """(bytes of each sample of ``filled``, their shapes or None, the error that stops the
        run or None): from the file sizes, or the image headers when decoded."""
        source = self.source
        try:
            if self.mode == "bytes":
                part = np.array([source.encoded_size(i) for i in filled], dtype=np.int64)
                return part, None, None
            found = list(_each(_Header(source, filled), workers))
            shapes_part = np.array(
                [cached_shape(int(w), int(h), self.image_size) for (w, h), _ in found],
                dtype=np.int64,
            ).reshape(-1, 2)
            part = shapes_part[:, 0] * shapes_part[:, 1] * 3
            error = self._record([(i, p) for i, (_, p) in zip(filled, found, strict=True)])
            return part, shapes_part, error
        except (DataError, OSError) as err:
            return np.zeros(0, dtype=np.int64), None, str(err)

    def _allocate(
        self, shared: bool, group: NodeGroup, name: str, total: int, need: int, copies: str
    ) -> None:
        """Sets ``segment``: ``total`` bytes, once ``need`` is known to fit the node."""
        count = len(self.source)
        if shared:
            # The leader checks and creates; the others open the segment after the
            # exchange that reports the leader's outcome.
            path = group.directory / f"{group.prefix}-{name}"
            error = None
            if group.is_leader:
                error = _memory_error(need, copies, self.mode, count, group)
                if error is None:
                    error, self.segment = _create(path, total)
            group.first_error(error)
            if self.segment is None:
                self.segment = Segment.attach(path, total)
        else:
            # Every rank checks before any allocates: a rank's check must not count the
            # parts its neighbours already hold.
            group.first_error(_memory_error(need, copies, self.mode, count, group))
            error, self.segment = _create(group.directory / f"{own_prefix()}-{name}", total)
            group.first_error(error)

    def _fill(
        self, filled: list[int], mine: range, shapes: np.ndarray | None, workers: int
    ) -> str | None:
        if self.mode == "bytes":
            fill: Dataset = _Read(self.source, filled)
        else:
            assert shapes is not None
            fill = _Decode(self.source, filled, shapes, self.image_size)
        try:
            for position, (flat, problem) in zip(mine, _each(fill, workers), strict=True):
                index = filled[position - mine.start]
                if problem:
                    error = self._record([(index, problem)])
                    if error:
                        return error
                    continue
                start, end = int(self.offsets[position]), int(self.offsets[position + 1])
                if flat.numel() != end - start:
                    return f"{self.source.describe(index)} changed while it was being cached"
                self.data[start:end] = flat
        except DataError as err:
            return str(err)
        return None

    def _record(self, problems: list[tuple[int, str]]) -> str | None:
        """Note the samples that did not decode; the error that stops the run, if it fails."""
        for index, problem in problems:
            if not problem:
                continue
            if self.bad_images.policy == "fail":
                return str(self.bad_images.error(problem))
            self.bad[index] = problem
        return None

    def close(self) -> None:
        """Remove the segment now (the owner); also done when the cache is collected or the
        process exits."""
        if self.segment is not None:
            self.segment.close()

    def __getstate__(self) -> dict[str, Any]:
        # ``segment`` pickles as its name; ``data`` is mapped again from it.
        return {k: v for k, v in self.__dict__.items() if k != "data"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.data = self.segment.tensor if self.segment is not None else torch.empty(0)

    def __len__(self) -> int:
        return len(self.source)

    def label(self, index: int) -> int:
        return self.source.label(index)

    def describe(self, index: int) -> str:
        return self.source.describe(index)

    def encoded_size(self, index: int) -> int:
        return self.source.encoded_size(index)

    def cached(self, index: int) -> bool:
        return bool(self.slots[index] >= 0)

    def _slice(self, slot: int) -> torch.Tensor:
        return self.data[int(self.offsets[slot]) : int(self.offsets[slot + 1])]

    def read(self, index: int) -> bytes:
        if self.mode != "bytes":
            raise TypeError("a decoded cache holds pixels, not encoded bytes")
        slot = int(self.slots[index])
        if slot < 0:
            return self.source.read(index)
        return self._slice(slot).numpy().tobytes()

    def pixels(self, index: int) -> torch.Tensor:
        if self.mode == "bytes":
            return decode_pixels(self.read(index), self.describe(index))
        if index in self.bad:
            raise DataError(self.bad[index])
        slot = int(self.slots[index])
        if slot < 0:
            # Outside a rank-scope part (an epoch resumed on another number of workers):
            # prepared exactly as the cache would have, so batches stay identical.
            return _downscaled(self.source, index, None, self.image_size)
        assert self.shapes is not None
        height, width = (int(v) for v in self.shapes[slot])
        return self._slice(slot).view(height, width, 3)  # a view: transforms never write to it


def _create(path: Path, size: int) -> tuple[str | None, Segment | None]:
    try:
        return None, Segment.create(path, size)
    except DataError as err:
        return str(err), None


def load_pixels(source: Source | MemoryCache, index: int) -> torch.Tensor:
    """The (height, width, 3) uint8 pixels of one sample."""
    if isinstance(source, MemoryCache):
        return source.pixels(index)
    return decode_pixels(source.read(index), source.describe(index))


def load_crop(source: Source | MemoryCache, index: int, choose_box: ChooseBox) -> torch.Tensor:
    """The pixels of the box ``choose_box(width, height)`` picks in one sample: of encoded
    samples only that region is decoded where it can be (``decode_crop``)."""
    if isinstance(source, MemoryCache) and source.mode == "decoded":
        return crop_of(source.pixels(index), choose_box)
    return decode_crop(source.read(index), source.describe(index), choose_box)


__all__ = ["MemoryCache", "Source", "cached_shape", "load_crop", "load_pixels"]
