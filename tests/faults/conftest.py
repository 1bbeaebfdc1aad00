"""Real failing file systems for the fault tests: a full disk and a read-only folder.

As root (CI here) they are a 2 MiB tmpfs (writes fail with ENOSPC) and an immutable folder
(chattr +i: even root gets EPERM); otherwise a file-size limit (EFBIG) and chmod 555.
"""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _run(*command: str) -> bool:
    return subprocess.run(command, capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A folder on a 2 MiB file system, or None when this user cannot mount one."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0 or not _run("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)):
        pytest.skip("needs root to mount a tmpfs (the file-size-limit test covers this user)")
    try:
        yield mount
    finally:
        _run("umount", "-l", str(mount))


def fill(folder: Path, leave_bytes: int) -> None:
    """Write a filler file until only about ``leave_bytes`` remain free."""
    stat = os.statvfs(folder)
    free = stat.f_bavail * stat.f_frsize
    with open(folder / "filler", "wb") as handle:
        handle.write(b"\0" * max(0, free - leave_bytes))


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    if os.geteuid() == 0:
        assert _run("chattr", "+i", str(folder)), "chattr +i failed"
        try:
            yield
        finally:
            _run("chattr", "-i", str(folder))
    else:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past ``limit`` bytes fail with EFBIG (Python ignores SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.fixture
def repo() -> Path:
    return Path(__file__).resolve().parents[2]
