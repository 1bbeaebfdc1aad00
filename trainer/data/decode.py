"""Encoded image files -> pixels: every place a sample's bytes are decoded.

JPEGs go to libjpeg-turbo through simplejpeg, straight into the array that becomes the tensor
(the same library Pillow's wheels bundle, so the same pixels, measured bit-identical; about 1.3x
faster, as it skips Pillow's image object and its copy out). Anything simplejpeg declines (PNG,
CMYK JPEG, a damaged file) goes through Pillow, which either decodes it or names why
not. A file that does not decode is a ``DataError`` naming it (``where``), whether it is found
while training, while filling a memory cache, or while ``prepare`` checks a dataset.
A training crop of a JPEG is decoded on its own where ``jpeg_region`` can (``decode_crop``):
its box comes from the header's size, and the rows and columns around it are not decoded.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import simplejpeg
import torch
from PIL import Image

from trainer.data import jpeg_region
from trainer.data.errors import DataError
from trainer.data.transforms import ChooseBox, crop_of

# What PIL raises for a truncated, corrupt or unknown image file.
_UNREADABLE = (OSError, SyntaxError, ValueError)


def decode(data: bytes, where: str) -> Image.Image:
    """The RGB image encoded in ``data`` (the file ``where``)."""
    try:
        with Image.open(io.BytesIO(data)) as raw:
            return raw.convert("RGB")
    except _UNREADABLE as err:
        raise DataError(f"cannot decode image {where}: {err}") from None


_JPEG_MAGIC = b"\xff\xd8"
# libjpeg-turbo converts these to RGB itself (CMYK and YCCK it would convert with another
# formula than Pillow's, one level apart), so only these take the fast path.
_FAST_COLORSPACES = ("YCbCr", "Gray", "RGB")


def decode_pixels(data: bytes, where: str) -> torch.Tensor:
    """The (height, width, 3) uint8 pixels encoded in ``data`` (the file ``where``)."""
    if data[:2] == _JPEG_MAGIC:
        try:
            if simplejpeg.decode_jpeg_header(data)[2] in _FAST_COLORSPACES:
                return torch.from_numpy(simplejpeg.decode_jpeg(data, colorspace="RGB"))
        except ValueError:
            pass  # a damaged file: Pillow decodes what it can or names the problem
    return decode_pixels_pil(data, where)


def decode_crop(data: bytes, where: str, choose_box: ChooseBox) -> torch.Tensor:
    """The (h, w, 3) uint8 pixels of the box ``choose_box(width, height)`` picks in the image
    encoded in ``data`` (the file ``where``). Of a JPEG only that region is decoded where
    ``jpeg_region`` can; the pixels are the same as the whole image's."""
    if data[:2] == _JPEG_MAGIC and jpeg_region.available():
        try:
            height, width = simplejpeg.decode_jpeg_header(data)[:2]
        except ValueError:
            pass  # a damaged header: the whole-image path names it
        else:
            box = choose_box(width, height)
            region = jpeg_region.decode_region(data, box, width)
            if region is not None:
                return torch.from_numpy(region)
            return crop_of(decode_pixels(data, where), lambda _w, _h: box)
    return crop_of(decode_pixels(data, where), choose_box)


def decode_pixels_pil(data: bytes, where: str) -> torch.Tensor:
    """``decode_pixels`` through Pillow only (its fallback, and the benchmarks' baseline)."""
    # np.asarray takes Pillow's one copy out of its image memory as it is (read-only); the
    # transforms never write into the pixels, so no second, writable copy is made.
    pixels = np.asarray(decode(data, where))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(pixels)


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
