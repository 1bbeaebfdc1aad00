"""Image folders: ``<root>/<class>/*.{jpg,jpeg,png}``, one file per sample."""

from __future__ import annotations

import os
from pathlib import Path

from trainer.data.errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


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


class FolderSource:
    """Encoded samples of an image folder, read one file at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.classes, self.samples = scan_image_folder(root)

    def __len__(self) -> int:
        return len(self.samples)

    def label(self, index: int) -> int:
        return self.samples[index][1]

    def describe(self, index: int) -> str:
        return self.samples[index][0]

    def encoded_size(self, index: int) -> int:
        return os.path.getsize(self.samples[index][0])

    def read(self, index: int) -> bytes:
        with open(self.samples[index][0], "rb") as file:
            return file.read()
