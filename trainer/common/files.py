"""File helpers shared by checkpoints and datasets: content hashes, all-or-nothing writes, and
the one error for a place that cannot take a write (``OutputError``)."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

_HASH_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def partial_path(path: Path) -> Path:
    """The hidden name ``path`` is written under until its rename: the one temp-name scheme of
    every all-or-nothing writer, so ``remove_partials`` finds what any of them left behind."""
    return path.with_name(f".{path.name}.partial-{os.getpid()}")


@contextmanager
def open_atomic(
    path: Path, before_replace: Callable[[Path], None] | None = None
) -> Iterator[BinaryIO]:
    """Temp file, fsync, rename: readers see the old file or the new one, never a part.

    Yields the temp file opened for writing. When the block ends without an exception the bytes
    are flushed and fsync'd, ``before_replace`` (if given) is called with the temp file's path
    (a checksum written beside the file before it becomes visible), and the temp file is renamed
    over ``path``. A write that fails (a full disk, an interrupt) removes its temp file."""
    temp = partial_path(path)
    try:
        with open(temp, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        if before_replace is not None:
            before_replace(temp)
        os.replace(temp, path)
    except BaseException:
        with suppress(OSError):  # the write's own error is the one to report
            temp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``path`` all or nothing (see ``open_atomic``)."""
    with open_atomic(path) as file:
        file.write(data)


def fsync_folder(folder: Path) -> None:
    """Make the renames done in ``folder`` survive a power loss."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


# What repairs each way a write fails; a reason not listed gets the generic fix.
_WRITE_FIXES = {
    errno.ENOSPC: "free space on that disk or pick another output folder",
    errno.EDQUOT: "free space within the quota or pick another output folder",
    errno.EFBIG: "pick an output folder on a file system that takes larger files",
    errno.EROFS: "the file system is mounted read-only: remount it read-write or pick another "
    "output folder",
    errno.EPERM: "the folder refuses writes even to its owner (immutable: chattr -i): lift that "
    "or pick another output folder",
    errno.EACCES: "make the folder writable for this user or pick another output folder",
    errno.ENOTDIR: "a file sits where a folder goes: move it away or pick another output folder",
    errno.EEXIST: "a file sits where a folder goes: move it away or pick another output folder",
    errno.EISDIR: "a folder sits where a file goes: move it away or pick another output folder",
}


class OutputError(Exception):
    """A writer cannot write where it was asked to: an environment fault, not bad data. The
    message is one line naming the path and the fix."""

    @classmethod
    def of(cls, err: OSError, where: Path) -> OutputError:
        """``err`` (raised while writing into ``where``) as one line naming the path that failed
        (the one the error names, else ``where``) and the fix for its reason."""
        failed = Path(os.fsdecode(err.filename)) if err.filename is not None else where
        if (
            ".partial-" in failed.name
        ):  # a temp file (trainer.common.files): name the folder it is in
            failed = failed.parent
        reason = err.strerror or type(err).__name__
        fix = _WRITE_FIXES.get(err.errno or 0, "check that folder and its file system")
        return cls(f"cannot write {failed}: {reason}; {fix}")
