"""How samples are decoded and how ``prepare`` stores them: the fast JPEG path gives Pillow's
pixels, what it declines still decodes or is named, and images stored scaled down give the
training crops the originals give."""

import io
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from trainer.data import decode
from trainer.data.errors import DataError
from trainer.data.manifest import Manifest
from trainer.data.prepare import DEFAULT_MAX_SHORT_SIDE, prepare
from trainer.data.transforms import lossless_short_side, random_resized_crop_box

QUIET = {"log": lambda _: None}


def scene(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth photo-like image (upsampled noise) with a little grain."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (9, 12, 3), dtype=np.uint8))
    pixels = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    grain = rng.integers(-3, 4, pixels.shape)
    return Image.fromarray(np.clip(pixels + grain, 0, 255).astype(np.uint8))


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def pillow_pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


@pytest.mark.parametrize(
    "mode, options",
    [("RGB", {"quality": 90}), ("RGB", {"quality": 75, "progressive": True}), ("L", {})],
)
def test_jpegs_take_the_fast_path_and_give_pillows_pixels(monkeypatch, mode, options):
    data = encoded(scene(64, 48).convert(mode), "JPEG", **options)
    expected = pillow_pixels(data)
    monkeypatch.setattr(decode, "decode_pixels_pil", lambda *_: pytest.fail("Pillow was used"))
    pixels = decode.decode_pixels(data, "a.jpg")
    assert pixels.dtype == torch.uint8 and np.array_equal(pixels.numpy(), expected)


def test_what_the_fast_path_declines_pillow_decodes():
    cmyk = encoded(scene(40, 30).convert("CMYK"), "JPEG")  # libjpeg-turbo cannot convert CMYK
    png = encoded(scene(40, 30), "PNG")
    for data in (cmyk, png):
        assert np.array_equal(decode.decode_pixels(data, "x").numpy(), pillow_pixels(data))


@pytest.mark.parametrize(
    "data",
    [
        encoded(scene(64, 48), "JPEG")[:300],  # truncated
        b"\xff\xd8" + b"\x00" * 200,  # a JPEG marker and nothing else
        b"not an image at all",
    ],
    ids=["truncated-jpeg", "jpeg-marker-only", "garbage"],
)
def test_an_undecodable_sample_is_one_error_naming_it(data):
    with pytest.raises(DataError, match=r"^cannot decode image shard-3\.tar:000000007: "):
        decode.decode_pixels(data, "shard-3.tar:000000007")


@settings(max_examples=60)
@given(
    size=st.sampled_from([112, 224, 288]),
    aspect=st.floats(1.0, 3.0),
    portrait=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_at_the_lossless_short_side_every_training_crop_is_a_downscale(
    size, aspect, portrait, seed
):
    short = lossless_short_side(size)
    width, height = round(short * aspect), short
    if portrait:
        width, height = height, width
    generator = torch.Generator().manual_seed(seed)
    for _ in range(200):
        left, top, right, bottom = random_resized_crop_box(width, height, generator)
        assert min(right - left, bottom - top) >= size


def psnr_of_crops(original: Image.Image, stored: Image.Image, count: int = 60) -> float:
    """Training crops (the same boxes, in each image's own coordinates) resized to 224: their
    PSNR in dB, the stored image's crops against the original's."""
    width, height = original.size
    sx, sy = stored.size[0] / width, stored.size[1] / height
    generator = torch.Generator().manual_seed(0)
    errors = []
    for _ in range(count):
        left, top, right, bottom = random_resized_crop_box(width, height, generator)
        crops = [
            np.asarray(
                image.resize((224, 224), Image.Resampling.BILINEAR, box=box), dtype=np.float64
            )
            for image, box in (
                (original, (left, top, right, bottom)),
                (stored, (left * sx, top * sy, right * sx, bottom * sy)),
            )
        ]
        errors.append(((crops[0] - crops[1]) ** 2).mean())
    return float(10 * np.log10(255**2 / np.mean(errors)))


def stored_members(folder):
    members = {}
    for shard in Manifest.load(folder).shards:
        with tarfile.open(folder / shard.name) as tar:
            for member in tar:
                if not member.name.endswith(".cls"):
                    file = tar.extractfile(member)
                    assert file is not None
                    members[member.name] = file.read()
    return members


def test_prepare_scales_down_only_larger_images_keeping_format_and_aspect(tmp_path):
    src = tmp_path / "src" / "train"
    big, small = scene(1200, 900, 1), scene(400, 300, 2)
    (src / "a").mkdir(parents=True)
    (src / "a" / "big.jpg").write_bytes(encoded(big, "JPEG", quality=92))
    (src / "a" / "small.jpg").write_bytes(small_bytes := encoded(small, "JPEG", quality=92))
    (src / "a" / "big.png").write_bytes(encoded(big, "PNG"))
    prepare(tmp_path / "src", tmp_path / "out", max_short_side=320, processes=1, **QUIET)
    assert Manifest.load(tmp_path / "out").max_short_side == 320
    members = stored_members(tmp_path / "out")
    sizes = {}
    for name, data in members.items():
        with Image.open(io.BytesIO(data)) as image:
            sizes[name] = (image.format, image.size)
    # Sorted sample order: big.jpg, big.png, small.jpg.
    assert sizes == {
        "000000000.jpg": ("JPEG", (427, 320)),
        "000000001.png": ("PNG", (427, 320)),
        "000000002.jpg": ("JPEG", (400, 300)),
    }
    assert members["000000002.jpg"] == small_bytes  # not larger: stored as it was


def test_scaled_down_shards_are_byte_identical_whatever_the_process_count(tmp_path):
    src = tmp_path / "src" / "train"
    for index in range(6):
        folder = src / f"c{index % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index}.jpg").write_bytes(encoded(scene(500, 375, index), "JPEG"))
    runs = []
    for processes, out in ((1, "a"), (2, "b")):
        prepare(
            tmp_path / "src",
            tmp_path / out,
            max_short_side=256,
            shard_mb=0.03,
            processes=processes,
            **QUIET,
        )
        runs.append({p.name: p.read_bytes() for p in sorted((tmp_path / out).iterdir())})
    assert len(runs[0]) > 2 and runs[0] == runs[1]


def test_the_default_size_changes_nothing_a_training_crop_sees_and_256_does(tmp_path):
    """The README's claim for the default, measured: crops of an image stored at the default
    short side match the original's to within JPEG noise; stored at 256 they measurably do not."""
    original = scene(2 * DEFAULT_MAX_SHORT_SIDE, round(1.5 * DEFAULT_MAX_SHORT_SIDE), 5)
    path = tmp_path / "src" / "train" / "a" / "photo.jpg"
    path.parent.mkdir(parents=True)
    path.write_bytes(encoded(original, "JPEG", quality=95))
    with Image.open(path) as image:
        source = image.convert("RGB")
    psnr = {}
    for max_short_side in (DEFAULT_MAX_SHORT_SIDE, 256):
        out = tmp_path / f"out-{max_short_side}"
        prepare(tmp_path / "src", out, max_short_side=max_short_side, processes=1, **QUIET)
        (data,) = stored_members(out).values()
        with Image.open(io.BytesIO(data)) as image:
            assert min(image.size) == max_short_side
            psnr[max_short_side] = psnr_of_crops(source, image.convert("RGB"))
    assert psnr[DEFAULT_MAX_SHORT_SIDE] > 40, psnr  # JPEG-noise level: nothing measurable lost
    assert psnr[256] < psnr[DEFAULT_MAX_SHORT_SIDE] - 3, psnr


def test_cli_rejects_a_negative_size_in_one_line(tmp_path, dataset):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.data",
            "prepare",
            str(dataset),
            str(tmp_path / "out"),
            "--max-short-side",
            "-1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    # The parser's own range (trainer.common.cli.int_in): one line naming the flag and what it
    # takes.
    assert result.stderr.startswith("error: argument --max-short-side: '-1': give an integer in")
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "out").exists()
