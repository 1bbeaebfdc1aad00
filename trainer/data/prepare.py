"""``prepare``: an ImageNet-layout folder becomes tar shards plus a manifest.

Many small files starve GPUs on network file systems; shards of tens of MB read at full
bandwidth. Shards are tar files with WebDataset member names (``<key>.jpg``/``<key>.png`` and
``<key>.cls``), so WebDataset and ``tar tf`` read them too. The output is a pure function of the
input: samples sorted, tar headers without times or owners, a manifest without timestamps; the
same dataset gives byte-identical shards on any machine with the same Pillow, however many
processes write them.

Images whose short side exceeds ``max_short_side`` are stored scaled down to it (decoding is
most of a sample's cost, and it grows with the pixels). The default keeps every 224 px training
crop a downscale (``lossless_short_side``), so it changes nothing a crop sees; a smaller value
is faster and loses detail in the small crops (docs/data.md).
"""

from __future__ import annotations

import csv
import io
import os
import tarfile
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from PIL import Image

from trainer.common.files import (
    OutputError,
    ensure_writable_folder,
    remove_partials,
    sha256_file,
    write_atomic,
)
from trainer.data.decode import check_image
from trainer.data.errors import DataError
from trainer.data.folder import IMAGE_SUFFIXES, scan_image_folder
from trainer.data.manifest import (
    MANIFEST_NAME,
    MAX_SHARD_MB,
    VERIFIED_NAME,
    Manifest,
    ShardEntry,
    SplitEntry,
)
from trainer.data.transforms import lossless_short_side, short_side_shape
from trainer.data.worker_processes import forkserver

DEFAULT_SHARD_MB = 64
# For the standard 224 px training crops: 915.
DEFAULT_MAX_SHORT_SIDE = lossless_short_side(224)
# A scaled-down JPEG is encoded again; at 95 its own error is below what the originals' (ImageNet
# is mostly quality ~90) already carry. PNGs stay PNG (lossless).
RESIZED_JPEG_QUALITY = 95
# Labels files for a flat val/ folder: ImageNet's Kaggle CSV, or "<file> <class>" lines.
VAL_LABEL_FILES = ("LOC_val_solution.csv", "labels.txt")
_TAR_BLOCK = 512


@dataclass(frozen=True)
class Sample:
    path: str
    label: int
    size: int  # bytes as stored in the shard


def scaled_down(path: str, max_short_side: int) -> bytes | None:
    """The image at ``path`` encoded again with its short side at ``max_short_side`` (same
    format), or None when it is no larger and is stored as it is (also when 0: never scale)."""
    with Image.open(path) as image:
        width, height = image.size
        if not max_short_side or min(width, height) <= max_short_side:
            return None
        new_height, new_width = short_side_shape(width, height, max_short_side)
        # JPEG: decode at the smallest DCT scale still at least the target (exact, and much
        # faster than decoding every pixel), then resample to the target with Lanczos.
        image.draft("RGB", (new_width, new_height))
        rgb = image.convert("RGB").resize((new_width, new_height), Image.Resampling.LANCZOS)
        is_png = image.format == "PNG"
    out = io.BytesIO()
    if is_png:
        rgb.save(out, "PNG")
    else:
        rgb.save(out, "JPEG", quality=RESIZED_JPEG_QUALITY)
    return out.getvalue()


def stored_bytes(path: str, max_short_side: int) -> bytes:
    """What the shard holds for the image at ``path``."""
    data = scaled_down(path, max_short_side)
    return data if data is not None else Path(path).read_bytes()


@dataclass(frozen=True)
class PrepareResult:
    manifest: Manifest
    skipped: int


def _tar_bytes(size: int) -> int:
    """Bytes a member of ``size`` takes in a tar: header plus data padded to 512."""
    return _TAR_BLOCK + -(-size // _TAR_BLOCK) * _TAR_BLOCK


# ImageNet's Kaggle CSV: its header, and where the class is in a row's PredictionString.
CSV_COLUMNS = ("ImageId", "PredictionString")


def _labels_txt(file: TextIO, name: Path) -> Iterator[tuple[int, str, str]]:
    """(line number, image, class) of each "<image> <class>" line (a comma also separates)."""
    for number, line in enumerate(file, start=1):
        fields = line.replace(",", " ").split()
        if not fields:
            continue
        if len(fields) == 1:
            raise DataError(
                f"{name}: {line.strip()!r} on line {number} has no class: write "
                f"'<image> <class>' on each line"
            )
        if len(fields) > 2:
            raise DataError(
                f"{name}: {line.strip()!r} on line {number} gives {len(fields) - 1} classes: "
                f"write one '<image> <class>' per line"
            )
        yield number, fields[0], fields[1]


def _solution_csv(file: TextIO, name: Path) -> Iterator[tuple[int, str, str]]:
    """(line number, image, class) of each row of ImageNet's ``LOC_val_solution.csv``:
    ``ImageId,PredictionString`` where the prediction starts with the class id."""
    reader = csv.DictReader(file)
    header = reader.fieldnames or []
    missing = [column for column in CSV_COLUMNS if column not in header]
    if missing:
        raise DataError(
            f"{name}: header {','.join(header)!r} on line 1 lacks {missing[0]}: the first line "
            f"must be {','.join(CSV_COLUMNS)!r}"
        )
    for row in reader:
        number = reader.line_num
        image, prediction = row[CSV_COLUMNS[0]], row[CSV_COLUMNS[1]]
        if not any(value and value.strip() for value in row.values() if isinstance(value, str)):
            continue  # a blank row
        if prediction is None or not image or not image.strip():
            raise DataError(
                f"{name}: row {','.join(str(v) for v in row.values() if v)!r} on line {number} "
                f"lacks a column: write '<ImageId>,<class id> <box>...' rows"
            )
        if not prediction.split():
            raise DataError(
                f"{name}: empty PredictionString for {image.strip()!r} on line {number}: it "
                f"must start with the class id (n01751748 x0 y0 x1 y1 ...)"
            )
        yield number, image.strip(), prediction.split()[0]


def _val_labels(val: Path, classes: list[str]) -> list[tuple[str, int]]:
    index = {name: label for label, name in enumerate(classes)}
    for name in VAL_LABEL_FILES:
        labels_file = val / name
        if not labels_file.is_file():
            continue
        read = _solution_csv if name.endswith(".csv") else _labels_txt
        try:
            with open(labels_file, newline="", encoding="utf-8-sig") as file:
                entries = list(read(file, labels_file))
        except UnicodeDecodeError as err:
            raise DataError(
                f"{labels_file}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                f"{err.start}); save it as UTF-8"
            ) from None
        except csv.Error as err:
            raise DataError(f"{labels_file}: not readable as CSV ({err}); fix that line") from None
        files = {
            Path(entry.name).stem: entry.path
            for entry in os.scandir(val)
            if entry.name.lower().endswith(IMAGE_SUFFIXES)
        }
        listed_on: dict[str, int] = {}
        samples = []
        for number, listed, label in entries:
            stem = Path(listed).stem
            if stem in listed_on:
                raise DataError(
                    f"{labels_file}: {stem} on line {number} is already listed on line "
                    f"{listed_on[stem]}: list each image once"
                )
            listed_on[stem] = number
            if label not in index:
                raise DataError(
                    f"{labels_file}: class {label!r} for {stem} on line {number} is not in "
                    f"train/: use a class folder name of train/ (such as {classes[0]!r})"
                )
            if stem not in files:
                raise DataError(
                    f"{labels_file}: lists {stem} on line {number}, which is not an image in "
                    f"{val}: remove the line or add the image"
                )
            samples.append((listed, files[stem], index[label]))
        return [(path, label) for _, path, label in sorted(samples)]
    raise DataError(
        f"{val}: has neither class folders nor a labels file ({', '.join(VAL_LABEL_FILES)})"
    )


def scan_dataset(src: Path) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """Classes from train/ and the (path, label) samples of each split, in a stable order."""
    classes, train = scan_image_folder(src / "train")
    splits = {"train": train}
    val = src / "val"
    if val.is_dir():
        if any(entry.is_dir() for entry in os.scandir(val)):
            val_classes, val_samples = scan_image_folder(val)
            unknown = sorted(set(val_classes) - set(classes))
            if unknown:
                raise DataError(f"{val}: class folder {unknown[0]!r} is not in {src / 'train'}")
            remap = {i: classes.index(name) for i, name in enumerate(val_classes)}
            splits["val"] = [(path, remap[label]) for path, label in val_samples]
        else:
            splits["val"] = _val_labels(val, classes)
    return classes, splits


def _inspect(path: str, max_short_side: int) -> tuple[str | None, int]:
    """(why the image is unreadable or None, its size as stored)."""
    problem = check_image(path)
    if problem is not None:
        return problem, 0
    # Encoded here only to learn the size shards are planned with, and again when written (it
    # is deterministic): holding every encoded image until then would not fit in memory.
    data = scaled_down(path, max_short_side)
    return None, len(data) if data is not None else os.path.getsize(path)


def _inspect_many(job: tuple[list[str], int]) -> list[tuple[str | None, int]]:
    paths, max_short_side = job
    return [_inspect(path, max_short_side) for path in paths]


def plan_shards(samples: list[Sample], target_bytes: int) -> list[list[int]]:
    """Consecutive sample indices per shard, each shard at most ``target_bytes`` of tar (a
    single larger sample gets a shard of its own)."""
    shards: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index, sample in enumerate(samples):
        need = _tar_bytes(sample.size) + _tar_bytes(len(str(sample.label)))
        if current and size + need > target_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(index)
        size += need
    if current:
        shards.append(current)
    return shards


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_shard(
    path: Path, members: list[tuple[int, str, int]], max_short_side: int = 0
) -> ShardEntry:
    """Write (key, image path, label) members to ``path`` atomically; return its entry."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, image_path, label in members:
            suffix = Path(image_path).suffix.lower()
            extension = "png" if suffix == ".png" else "jpg"
            data = stored_bytes(image_path, max_short_side)
            tar.addfile(_member(f"{key:09d}.{extension}", len(data)), io.BytesIO(data))
            label_bytes = str(label).encode()
            tar.addfile(_member(f"{key:09d}.cls", len(label_bytes)), io.BytesIO(label_bytes))
    write_atomic(path, buffer.getvalue())
    return ShardEntry(path.name, path.stat().st_size, len(members), sha256_file(path))


def _write_shard_job(job: tuple[str, list[tuple[int, str, int]], int]) -> ShardEntry:
    return write_shard(Path(job[0]), job[1], job[2])


def _check_output_folder(out: Path, src: Path) -> None:
    if out.resolve().is_relative_to(src.resolve()):
        raise DataError(f"output folder {out} is inside the source {src}: pick a folder outside it")
    if out.exists() and not out.is_dir():
        raise DataError(f"output folder {out} is a file: pick a folder")
    if out.is_dir():
        foreign = [
            entry.name
            for entry in os.scandir(out)
            if entry.name not in (MANIFEST_NAME, VERIFIED_NAME)
            and not entry.name.endswith(".tar")
            and ".partial-" not in entry.name
        ]
        if foreign:
            raise DataError(
                f"output folder {out} holds {foreign[0]!r}, which prepare did not write: "
                f"pick an empty folder"
            )


def prepare(
    src: Path,
    out: Path,
    *,
    shard_mb: float = DEFAULT_SHARD_MB,
    max_short_side: int = DEFAULT_MAX_SHORT_SIDE,
    processes: int | None = None,
    strict: bool = False,
    log: Callable[[str], None] = print,
) -> PrepareResult:
    """Shard ``src`` (train/<class>/..., optional val/) into ``out``. Unreadable images are
    skipped, counted and listed in the manifest, or with ``strict`` stop the run naming the file.
    Images with a short side over ``max_short_side`` (0: none) are stored scaled down to it.
    All checks run before the first shard is written."""
    if not 0 < shard_mb <= MAX_SHARD_MB:  # NaN too
        raise DataError(
            f"shard_mb={shard_mb}: must be a positive number of MB, {MAX_SHARD_MB:g} at most"
        )
    if max_short_side < 0:
        raise DataError(
            f"max_short_side={max_short_side}: give a size in pixels, or 0 to store images as "
            f"they are"
        )
    _check_output_folder(out, src)
    classes, found = scan_dataset(src)
    _check_writable(out)
    processes = processes or os.cpu_count() or 1
    with ProcessPoolExecutor(processes, mp_context=forkserver()) as pool:
        splits: dict[str, list[Sample]] = {}
        skipped: dict[str, list[str]] = {}
        for split, pairs in found.items():
            paths = [path for path, _ in pairs]
            step = max(1, len(paths) // (processes * 8))
            chunks = [(paths[i : i + step], max_short_side) for i in range(0, len(paths), step)]
            found_images = [each for chunk in pool.map(_inspect_many, chunks) for each in chunk]
            kept, bad = [], []
            for (path, label), (problem, size) in zip(pairs, found_images, strict=True):
                relative = os.path.relpath(path, src)
                if problem is None:
                    kept.append(Sample(path, label, size))
                elif strict:
                    raise DataError(f"cannot decode image {relative}: {problem} (--strict)")
                else:
                    bad.append(relative)
            if not kept:
                raise DataError(f"{src / split}: no readable images")
            splits[split], skipped[split] = kept, bad
        try:
            manifest = _write(pool, out, classes, splits, skipped, shard_mb, max_short_side)
        except OSError as err:
            # Shards are renamed into place only when complete and the manifest, which alone
            # makes the folder a dataset, was removed first: what a failed write leaves is
            # never taken for a complete dataset.
            raise OutputError.of(err, out) from None
    total_skipped = sum(len(bad) for bad in skipped.values())
    for split, entry in manifest.splits.items():
        log(f"{split}: {entry.samples} images in {len(entry.shards)} shards")
    if total_skipped:
        log(f"skipped {total_skipped} unreadable image(s), listed in {out / MANIFEST_NAME}")
    return PrepareResult(manifest, total_skipped)


def _check_writable(out: Path) -> None:
    """Prove ``out`` takes files before the images are inspected (minutes for ImageNet), and
    leave no folder behind when it is new: a later error must not leave an empty output."""
    created = not out.exists()
    try:
        ensure_writable_folder(out)
    except OSError as err:
        raise OutputError.of(err, out) from None
    finally:
        if created:
            with suppress(OSError):
                out.rmdir()


def _write(
    pool: ProcessPoolExecutor,
    out: Path,
    classes: list[str],
    splits: dict[str, list[Sample]],
    skipped: dict[str, list[str]],
    shard_mb: float,
    max_short_side: int,
) -> Manifest:
    """Write the planned shards, then the manifest, into ``out``; remove what it no longer
    lists. The old manifest goes first: until the new one lands the folder is no dataset."""
    out.mkdir(parents=True, exist_ok=True)
    remove_partials(out)
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    jobs = []
    layout: dict[str, list[str]] = {}
    for split, samples in splits.items():
        plan = plan_shards(samples, int(shard_mb * 1024 * 1024))
        layout[split] = [f"{split}-{n:06d}.tar" for n in range(len(plan))]
        for name, indices in zip(layout[split], plan, strict=True):
            members = [(i, samples[i].path, samples[i].label) for i in indices]
            jobs.append((str(out / name), members, max_short_side))
    entries = {entry.name: entry for entry in pool.map(_write_shard_job, jobs)}
    manifest = Manifest(
        classes=tuple(classes),
        max_short_side=max_short_side,
        splits={
            split: SplitEntry(
                samples=len(samples),
                shards=tuple(entries[name] for name in layout[split]),
                skipped=tuple(skipped[split]),
            )
            for split, samples in splits.items()
        },
    )
    write_atomic(out / MANIFEST_NAME, manifest.to_json().encode())
    # Shards of an earlier prepare that this manifest no longer lists (and the training
    # side's record of verified shards, which named the old ones).
    for stale in set(os.listdir(out)) - set(entries) - {MANIFEST_NAME}:
        (out / stale).unlink()
    return manifest
