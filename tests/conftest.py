"""Shared helpers: small image folders written with Pillow, and trainer configs for tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image


def write_image_folder(root: Path, classes: int = 3, per_class: int = 6, size: int = 40) -> Path:
    generator = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for label in range(classes):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = torch.randint(
                    0, 256, (size, size + 8, 3), generator=generator, dtype=torch.uint8
                )
                image = Image.fromarray(pixels.numpy())
                suffix = ".png" if i % 2 else ".JPEG"
                image.save(folder / f"img{i}{suffix}")
    return root


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return write_image_folder(tmp_path / "images")
