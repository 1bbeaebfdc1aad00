"""Real failing file systems for the fault tests: a full disk and a read-only folder.

As root (CI here) they are a 2 MiB tmpfs (writes fail with ENOSPC) and an immutable folder
(chattr +i: even root gets EPERM); otherwise a file-size limit (EFBIG) and chmod 555.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fs_faults import _run, tmpfs


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A folder on a 2 MiB file system (skipped when this user cannot mount one)."""
    with tmpfs(tmp_path / "small-disk", "2m") as mount:
        yield mount


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


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(no_leftover_processes: str) -> None:
    """Every run started here is checked for processes left alive (tests/process_tree.py)."""


@pytest.fixture
def repo() -> Path:
    return Path(__file__).resolve().parents[2]
