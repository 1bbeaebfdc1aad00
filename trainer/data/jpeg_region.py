"""Decode only the pixels a training crop keeps: ``jpeg_region.c`` (libjpeg-turbo's
``jpeg_crop_scanline`` and ``jpeg_skip_scanlines``), loaded through ctypes.

The crop's pixels are the whole image's, bit for bit
(``tests/trainer/data/test_jpeg_region.py``), at about 1.3x the speed of decoding all of a
500x375 photo. ``scripts/build_jpeg_region.sh`` builds
the library into the Python environment (``make test``/``make demo`` and the trainer image do);
without it, or with one built from another version of the source, ``available()`` is False and
images are decoded whole, as before.
"""

from __future__ import annotations

import ctypes
import hashlib
import sys
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("jpeg_region.c")
# Beside the environment's own libraries: built for this interpreter, never part of the sources
# (whose bytes name the trainer image, infra/image_inputs.py).
LIBRARY = Path(sys.prefix) / "lib" / "trainer" / "libjpeg_region.so"
# Columns decoded beyond each side of the box. At a region's edge libjpeg's fancy upsampling
# repeats the edge chroma sample where the whole image has its neighbour; with 16 more columns
# (two chroma samples even at 4:1:1) the box itself matches the whole image exactly.
MARGIN = 16
# jpeg_crop_scanline moves the region's left edge down to an iMCU boundary, widening it by up to
# one iMCU: 32 columns at most (4 luma samples per chroma sample x 8).
ALIGNMENT = 32
# What jpeg_region_decode returns when it decoded the region.
DECODED = 0


def source_digest() -> str:
    """What the library must report having been built from (a SHA-256 prefix of SOURCE)."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def _load() -> ctypes.CDLL | None:
    try:
        library = ctypes.CDLL(str(LIBRARY))
    except OSError:
        return None
    library.jpeg_region_source.restype = ctypes.c_char_p
    if library.jpeg_region_source().decode() != source_digest():
        return None  # stale: built from another version of jpeg_region.c
    library.jpeg_region_decode.restype = ctypes.c_int
    library.jpeg_region_decode.argtypes = [
        ctypes.c_char_p,  # data
        ctypes.c_ulong,  # size
        ctypes.POINTER(ctypes.c_int),  # left, moved to the iMCU boundary it decoded from
        ctypes.c_int,  # top
        ctypes.c_int,  # width
        ctypes.c_int,  # height
        ctypes.c_void_p,  # out
        ctypes.c_long,  # out_stride
    ]
    return library


_library = _load()


def available() -> bool:
    """Whether a library built from this version of jpeg_region.c is installed."""
    return _library is not None


def decode_region(
    data: bytes, box: tuple[int, int, int, int], image_width: int
) -> np.ndarray | None:
    """The (height, width, 3) uint8 pixels of ``box`` (left, top, right, bottom) in the JPEG
    ``data``, whose header says it is ``image_width`` wide; None where the library is missing or
    declines the file (CMYK, damaged, unusual): decode it whole then."""
    left, top, right, bottom = box
    if _library is None or not (0 <= left < right <= image_width and 0 <= top < bottom):
        return None  # (the library checks the bottom against the image's height)
    first, last = max(0, left - MARGIN), min(image_width, right + MARGIN)
    out = np.empty((bottom - top, last - first + ALIGNMENT, 3), dtype=np.uint8)
    decoded_from = ctypes.c_int(first)
    status = _library.jpeg_region_decode(
        data,
        len(data),
        ctypes.byref(decoded_from),
        top,
        last - first,
        bottom - top,
        out.ctypes.data,
        out.strides[0],
    )
    if status != DECODED:
        return None
    start = left - decoded_from.value
    return out[:, start : start + right - left]
