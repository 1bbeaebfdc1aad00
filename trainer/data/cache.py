"""In-memory caches: read (and decode) every sample once, serve later epochs from RAM.

``bytes`` keeps the encoded files (the dataset's size on disk; decoding still costs CPU every
epoch). ``decoded`` keeps pixels, downscaled so the short side is what the transforms use
(``image_size * 256 / 224``, the validation resize), so later epochs only crop, flip and
normalize. Both live in shared-memory tensors: DataLoader workers started by forkserver receive
a handle, not a copy. The exact size is computed from the image headers and checked against the
free memory of the node (times the ranks on it, each holds its own cache) before filling starts.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from trainer.data.decode import decode_pixels, image_size
from trainer.data.errors import DataError
from trainer.data.transforms import eval_resize, resize, short_side_shape

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


class _Header(Dataset[tuple[int, int]]):
    def __init__(self, source: Source) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return image_size(self.source.read(index), self.source.describe(index))


class _Decode(Dataset[torch.Tensor]):
    def __init__(self, source: Source, shapes: np.ndarray) -> None:
        self.source, self.shapes = source, shapes

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> torch.Tensor:
        pixels = decode_pixels(self.source.read(index), self.source.describe(index))
        height, width = (int(v) for v in self.shapes[index])
        if (height, width) != pixels.shape[:2]:
            pixels = resize(pixels, height, width).permute(1, 2, 0)
        return pixels.flatten()


class _Read(Dataset[torch.Tensor]):
    def __init__(self, source: Source) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.frombuffer(bytearray(self.source.read(index)), dtype=torch.uint8)


def _each(dataset: Dataset, workers: int) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context="forkserver" if workers else None,
        # Its own generator: iterating must not draw from the global RNG, which seeds the model.
        generator=torch.Generator().manual_seed(0),
    )


def _check_memory(need: int, ranks_per_node: int, mode: str, count: int) -> None:
    total = need * ranks_per_node
    free = psutil.virtual_memory().available
    if total > 0.9 * free:
        raise DataError(
            f"cache={mode}: {count} images need {total / 2**30:.1f} GiB "
            f"({ranks_per_node} rank(s) on this node) but {free / 2**30:.1f} GiB is free: "
            f"use --cache bytes or --cache none"
        )


class MemoryCache:
    """A ``Source`` (and, when decoded, an image store) held in shared memory."""

    def __init__(
        self, source: Source, mode: str, image_size: int, workers: int, ranks_per_node: int = 1
    ) -> None:
        if mode not in ("bytes", "decoded"):
            raise ValueError(f"cache mode {mode!r}")
        self.source, self.mode = source, mode
        count = len(source)
        if mode == "bytes":
            sizes = np.array([source.encoded_size(i) for i in range(count)], dtype=np.int64)
            self.shapes = None
            fill: Dataset = _Read(source)
        else:
            dims = np.array(list(_each(_Header(source), workers)), dtype=np.int64).reshape(-1, 2)
            self.shapes = np.array(
                [cached_shape(int(w), int(h), image_size) for w, h in dims], dtype=np.int64
            ).reshape(-1, 2)
            sizes = self.shapes[:, 0] * self.shapes[:, 1] * 3
            fill = _Decode(source, self.shapes)
        _check_memory(int(sizes.sum()), ranks_per_node, mode, count)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.data = torch.empty(int(self.offsets[-1]), dtype=torch.uint8).share_memory_()
        log.info("cache=%s: filling %.2f GiB for %d images", mode, self.data.numel() / 2**30, count)
        for index, flat in enumerate(_each(fill, workers)):
            start, end = int(self.offsets[index]), int(self.offsets[index + 1])
            if flat.numel() != end - start:
                raise DataError(f"{source.describe(index)} changed while it was being cached")
            self.data[start:end] = flat

    def __len__(self) -> int:
        return len(self.source)

    def label(self, index: int) -> int:
        return self.source.label(index)

    def describe(self, index: int) -> str:
        return self.source.describe(index)

    def encoded_size(self, index: int) -> int:
        return self.source.encoded_size(index)

    def _slice(self, index: int) -> torch.Tensor:
        return self.data[int(self.offsets[index]) : int(self.offsets[index + 1])]

    def read(self, index: int) -> bytes:
        if self.mode != "bytes":
            raise TypeError("a decoded cache holds pixels, not encoded bytes")
        return self._slice(index).numpy().tobytes()

    def pixels(self, index: int) -> torch.Tensor:
        if self.shapes is None:
            return decode_pixels(self.read(index), self.describe(index))
        height, width = (int(v) for v in self.shapes[index])
        return self._slice(index).view(height, width, 3)  # a view: transforms never write to it


def load_pixels(source: Source | MemoryCache, index: int) -> torch.Tensor:
    """The (height, width, 3) uint8 pixels of one sample."""
    if isinstance(source, MemoryCache):
        return source.pixels(index)
    return decode_pixels(source.read(index), source.describe(index))


__all__ = ["MemoryCache", "Source", "cached_shape", "load_pixels"]
