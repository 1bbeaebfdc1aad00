"""File helpers shared by checkpoints and datasets: content hashes and all-or-nothing writes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_HASH_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename: readers see the old file or the new one, never a part. A write
    that fails (a full disk) removes its temp file."""
    temp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        with open(temp, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def remove_partials(folder: Path) -> int:
    """Delete temp files an interrupted writer left behind; returns how many."""
    removed = 0
    for leftover in folder.glob(".*.partial-*"):
        leftover.unlink(missing_ok=True)
        removed += 1
    return removed


def ensure_writable_folder(folder: Path) -> None:
    """Create ``folder`` (and its parents) and prove a file can be written there; raises
    OSError otherwise. On a Batch pool the run folder lives on the shared NFS mount, where the
    non-admin task user can write only if the runs folder allows it."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
    finally:
        probe.unlink(missing_ok=True)
