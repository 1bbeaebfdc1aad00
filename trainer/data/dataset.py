"""Samples -> uint8 training tensors: decode (or take from the cache) and augment."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, get_worker_info

from trainer.data.bad_images import first_decodable
from trainer.data.cache import MemoryCache, Source, load_crop, load_pixels
from trainer.data.transforms import ChooseBox, augment_crop, eval_transform, random_resized_crop_box


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

    def crop(self, index: int, choose_box: ChooseBox) -> torch.Tensor:
        """The pixels of one sample's training crop, ``choose_box(width, height)``."""
        return load_crop(self.source, index, choose_box)

    def sample(self, index: int, epoch: int) -> tuple[torch.Tensor, int]:
        """The augmented uint8 image and label of ``index`` in ``epoch``."""
        if not self.train:
            return eval_transform(self.pixels(index), self.image_size), self.source.label(index)
        generator = torch.Generator().manual_seed(hash((self.seed, epoch, index)) & 0x7FFF_FFFF)
        crop = self.crop(
            index, lambda width, height: random_resized_crop_box(width, height, generator)
        )
        return augment_crop(crop, self.image_size, generator), self.source.label(index)


class CheckedImageDataset(ImageDataset):
    """What the loaders read: ``(image, label, problem)``. A sample that does not decode is
    replaced by the next one that does, and ``problem`` names it ("" for a sample served as it
    is); the training process decides what that means (``trainer.data.bad_images``)."""

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int, str]:
        index, epoch = key
        (image, label), problem = first_decodable(lambda i: self.sample(i, epoch), index, len(self))
        return image, label, problem


def collate_images(
    samples: list[tuple[torch.Tensor, int, str]],
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """A ``CheckedImageDataset`` batch: (images, labels, problems), the images (N, 3, H, W)
    uint8 in channels_last memory (NHWC).

    The transforms leave every sample's pixels in (H, W, 3) memory (torch's resize works and
    answers there), so an NHWC batch is filled with plain row copies. PyTorch's default collate
    writes (N, 3, H, W) contiguous memory instead: a per-pixel transposing copy, 0.05 ms of a
    loader core per 224 px sample (5x the row copy), which GPU runs then undid on the device to
    train channels_last. In a loader worker the batch is built in shared memory, as the default
    collate does, so it reaches the training process without another copy."""
    images, labels, problems = zip(*samples, strict=True)
    first = images[0]
    channels, height, width = first.shape
    shape = (len(images), height, width, channels)
    if get_worker_info() is None:
        batch = first.new_empty(shape)
    else:  # the default collate's own way to allocate a batch in shared memory
        storage = first._typed_storage()._new_shared(first.numel() * len(images))
        batch = first.new(storage).view(shape)
    for row, image in zip(batch, images, strict=True):
        row.copy_(image.permute(1, 2, 0))
    return batch.permute(0, 3, 1, 2), torch.tensor(labels), list(problems)
