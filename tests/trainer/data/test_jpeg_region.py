"""Region decoding (``trainer/data/jpeg_region.c``): a training crop decoded on its own holds the
whole image's pixels bit for bit, whatever the box, size and chroma layout; what the library
declines is decoded whole and named as before; and the library in this environment is the one
built from the source in this checkout."""

import ctypes
import io
import subprocess
import sys

import numpy as np
import pytest
import simplejpeg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from trainer.data import decode, jpeg_region
from trainer.data.errors import DataError
from trainer.data.transforms import random_resized_crop_box

# Pillow's subsampling codes: 4:4:4, 4:2:2, 4:2:0.
SUBSAMPLINGS = {"444": 0, "422": 1, "420": 2}


def photo(width: int, height: int, seed: int, mode: str = "RGB") -> Image.Image:
    """Smooth colour fields with grain: chroma that changes across block edges."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (7, 9, 3), dtype=np.uint8))
    pixels = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    grain = rng.integers(-10, 11, pixels.shape)
    return Image.fromarray(np.clip(pixels + grain, 0, 255).astype(np.uint8)).convert(mode)


def jpeg(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", **options)
    return out.getvalue()


def whole(data: bytes) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, colorspace="RGB")


def test_the_library_is_built_from_this_source():
    """``make test`` builds it; a missing or stale library would silently decode whole images."""
    assert jpeg_region.available(), (
        f"{jpeg_region.LIBRARY} is missing or stale: run scripts/build_jpeg_region.sh"
    )
    library = ctypes.CDLL(str(jpeg_region.LIBRARY))
    library.jpeg_region_source.restype = ctypes.c_char_p
    assert library.jpeg_region_source().decode() == jpeg_region.source_digest()


def test_a_library_built_from_other_source_is_not_used(monkeypatch):
    monkeypatch.setattr(jpeg_region, "source_digest", lambda: "0" * 16)
    assert jpeg_region._load() is None


@settings(max_examples=150)
@given(
    width=st.integers(1, 300),
    height=st.integers(1, 200),
    subsampling=st.sampled_from(sorted(SUBSAMPLINGS)),
    progressive=st.booleans(),
    seed=st.integers(0, 2**16),
    draw=st.data(),
)
def test_any_box_holds_the_whole_images_pixels(width, height, subsampling, progressive, seed, draw):
    data = jpeg(
        photo(width, height, seed),
        quality=90,
        subsampling=SUBSAMPLINGS[subsampling],
        progressive=progressive,
    )
    left = draw.draw(st.integers(0, width - 1))
    top = draw.draw(st.integers(0, height - 1))
    right = draw.draw(st.integers(left + 1, width))
    bottom = draw.draw(st.integers(top + 1, height))
    region = jpeg_region.decode_region(data, (left, top, right, bottom), width)
    assert region is not None
    assert np.array_equal(region, whole(data)[top:bottom, left:right])


@pytest.mark.parametrize("size", [(500, 375), (375, 500), (341, 256), (17, 9)])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_training_crops_and_edge_boxes_match(size, mode):
    width, height = size
    data = jpeg(photo(width, height, seed=width, mode=mode), quality=95)
    generator = torch.Generator().manual_seed(0)
    boxes = [random_resized_crop_box(width, height, generator) for _ in range(60)]
    # The whole image, each edge, single pixels in the corners, edges on iMCU boundaries.
    boxes += [
        (0, 0, width, height),
        (0, 0, 1, 1),
        (width - 1, height - 1, width, height),
        (min(16, width - 1), 0, width, height),
        (0, min(16, height - 1), min(32, width), height),
    ]
    pixels = whole(data)
    for left, top, right, bottom in boxes:
        region = jpeg_region.decode_region(data, (left, top, right, bottom), width)
        assert region is not None, (left, top, right, bottom)
        assert np.array_equal(region, pixels[top:bottom, left:right]), (left, top, right, bottom)


@pytest.mark.parametrize(
    "data",
    [
        jpeg(photo(64, 48, 1).convert("CMYK")),  # converted with another formula than Pillow's
        jpeg(photo(64, 48, 1))[:400],  # truncated: libjpeg warns, and a warning declines
        b"\xff\xd8" + b"\x00" * 200,
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 100,
    ],
    ids=["cmyk", "truncated", "marker-only", "png"],
)
def test_what_it_cannot_decode_exactly_it_declines(data):
    assert jpeg_region.decode_region(data, (0, 0, 8, 8), 64) is None


def test_a_box_outside_the_image_is_declined():
    data = jpeg(photo(64, 48, 2))
    for box in [(0, 0, 65, 48), (0, 40, 64, 49), (-1, 0, 10, 10), (5, 5, 5, 9)]:
        assert jpeg_region.decode_region(data, box, 64) is None


def test_declined_samples_are_decoded_whole_and_bad_ones_still_named():
    """``decode_crop`` falls back to the whole-image path with the same box, so a CMYK JPEG
    gets Pillow's pixels and a damaged file the one error naming it."""
    cmyk = jpeg(photo(40, 30, 3).convert("CMYK"))
    box = (3, 4, 30, 25)
    crop = decode.decode_crop(cmyk, "x", lambda w, h: box if (w, h) == (40, 30) else None)
    with Image.open(io.BytesIO(cmyk)) as image:
        expected = np.asarray(image.convert("RGB"))[4:25, 3:30]
    assert np.array_equal(crop.numpy(), expected)
    truncated = jpeg(photo(64, 48, 4))[:300]
    with pytest.raises(DataError, match=r"^cannot decode image shard-1\.tar:000000002: "):
        decode.decode_crop(truncated, "shard-1.tar:000000002", lambda w, h: (0, 0, 8, 8))


def test_samples_are_the_same_with_and_without_the_library(monkeypatch):
    data = jpeg(photo(500, 375, 5), quality=90)
    generator_seed = 7

    def sample() -> torch.Tensor:
        generator = torch.Generator().manual_seed(generator_seed)
        return decode.decode_crop(data, "x", lambda w, h: random_resized_crop_box(w, h, generator))

    with_region = sample()
    monkeypatch.setattr(jpeg_region, "_library", None)
    assert not jpeg_region.available()
    assert torch.equal(with_region, sample())


def test_the_build_script_names_a_missing_header(tmp_path):
    """Without libjpeg-turbo's headers the build stops with one line saying what to install."""
    compiler = tmp_path / "cc"
    compiler.write_text("#!/bin/sh\necho 'fatal error: jpeglib.h: No such file' >&2\nexit 1\n")
    compiler.chmod(0o755)
    result = subprocess.run(
        ["bash", "scripts/build_jpeg_region.sh", sys.executable],
        capture_output=True,
        text=True,
        env={"CC": str(compiler), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: jpeglib.h not found: install libjpeg-turbo's headers (libjpeg-dev) and rerun"
    ]
