"""An image-folder dataset: ``<root>/<class>/*.{jpg,jpeg,png}``, decoded with Pillow."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset

from trainer.data.transforms import eval_transform, train_transform

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class DataError(ValueError):
    """The data on disk cannot be used; the message is one line naming the path."""


def scan_image_folder(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted subfolder names) and (path, class index) samples, in a stable order."""
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist: expected <class>/<image> subfolders")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise DataError(f"data folder {root} has no class subfolders")
    samples = []
    for label, name in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(root / name)):
            for file in sorted(files):
                if file.lower().endswith(IMAGE_SUFFIXES):
                    samples.append((os.path.join(dirpath, file), label))
    if not samples:
        raise DataError(f"data folder {root} has no .jpg/.jpeg/.png images")
    return classes, samples


class ImageFolderDataset(Dataset[tuple[torch.Tensor, int]]):
    """Indexed by ``(index, epoch)`` pairs from ``ShardSampler``; augmentation randomness is
    seeded by (seed, epoch, index) so every sample sees the same crop wherever it is decoded."""

    def __init__(self, root: Path, image_size: int, *, train: bool, seed: int) -> None:
        self.root = root
        self.classes, self.samples = scan_image_folder(root)
        self.image_size = image_size
        self.train = train
        self.seed = seed

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        index, epoch = key
        path, label = self.samples[index]
        try:
            with Image.open(path) as raw:
                image = raw.convert("RGB")
        except OSError as err:
            raise DataError(f"cannot decode image {path}: {err}") from None
        if not self.train:
            return eval_transform(image, self.image_size), label
        generator = torch.Generator().manual_seed(hash((self.seed, epoch, index)) & 0x7FFF_FFFF)
        return train_transform(image, self.image_size, generator), label
