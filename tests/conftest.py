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


def tiny_config(output_dir: Path, **extra) -> dict:
    """Settings for a tiny, fast synthetic run (the tiny CNN at 16 px)."""
    values = dict(
        model="tiny",
        num_classes=5,
        image_size=16,
        batch_size=8,
        synthetic_size=64,
        synthetic_pool=32,
        epochs=3,
        warmup_epochs=1,
        lr=0.05,
        log_every=3,
        output_dir=str(output_dir),
    )
    return {**values, **extra}
