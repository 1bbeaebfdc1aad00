"""Encoded image files -> pixels: every place a sample's bytes are opened with PIL.

A file that does not decode is a ``DataError`` naming it (``where``), whether it is found while
training, while filling a memory cache, or while ``prepare`` checks a dataset.
"""

from __future__ import annotations

import io

import torch
from PIL import Image

from trainer.data.errors import DataError
from trainer.data.transforms import pil_to_pixels

# What PIL raises for a truncated, corrupt or unknown image file.
_UNREADABLE = (OSError, SyntaxError, ValueError)


def decode(data: bytes, where: str) -> Image.Image:
    """The RGB image encoded in ``data`` (the file ``where``)."""
    try:
        with Image.open(io.BytesIO(data)) as raw:
            return raw.convert("RGB")
    except _UNREADABLE as err:
        raise DataError(f"cannot decode image {where}: {err}") from None


def decode_pixels(data: bytes, where: str) -> torch.Tensor:
    """The (height, width, 3) uint8 pixels encoded in ``data`` (the file ``where``)."""
    return pil_to_pixels(decode(data, where))


def image_size(data: bytes, where: str) -> tuple[int, int]:
    """(width, height) from the image's header, without decoding its pixels."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except _UNREADABLE as err:
        raise DataError(f"cannot decode image {where}: {err}") from None


def check_image(path: str) -> str | None:
    """None if the image decodes completely, else the reason (a decode reads every byte)."""
    try:
        with Image.open(path) as image:
            image.draft("RGB", (64, 64))  # JPEG: decode at reduced scale, still reads it all
            image.load()
        return None
    except (*_UNREADABLE, Image.DecompressionBombError) as err:
        return str(err) or type(err).__name__
