"""Samples -> uint8 training tensors: decode (or take from the cache) and augment."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from trainer.data.bad_images import first_decodable
from trainer.data.cache import MemoryCache, Source, load_pixels
from trainer.data.transforms import eval_transform, train_transform


class ImageDataset(Dataset[tuple[torch.Tensor, int]]):
    """Indexed by ``(index, epoch)`` pairs from the samplers; augmentation randomness is seeded
    by (seed, epoch, index) so every sample sees the same crop wherever it is decoded."""

    def __init__(
        self, source: Source | MemoryCache, image_size: int, *, train: bool, seed: int
    ) -> None:
        self.source = source
        self.image_size = image_size
        self.train = train
        self.seed = seed

    def __len__(self) -> int:
        return len(self.source)

    def pixels(self, index: int) -> torch.Tensor:
        """The (height, width, 3) uint8 pixels of one sample, before augmentation."""
        return load_pixels(self.source, index)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        return self.sample(*key)

    def sample(self, index: int, epoch: int) -> tuple[torch.Tensor, int]:
        """The augmented uint8 image and label of ``index`` in ``epoch``."""
        pixels = self.pixels(index)
        label = self.source.label(index)
        if not self.train:
            return eval_transform(pixels, self.image_size), label
        generator = torch.Generator().manual_seed(hash((self.seed, epoch, index)) & 0x7FFF_FFFF)
        return train_transform(pixels, self.image_size, generator), label


class CheckedImageDataset(ImageDataset):
    """What the loaders read: ``(image, label, problem)``. A sample that does not decode is
    replaced by the next one that does, and ``problem`` names it ("" for a sample served as it
    is); the training process decides what that means (``trainer.data.bad_images``)."""

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int, str]:
        index, epoch = key
        (image, label), problem = first_decodable(lambda i: self.sample(i, epoch), index, len(self))
        return image, label, problem
