"""Real file-system faults for the writers' tests, made as root with a small tmpfs per fault.

- ``full``: a tmpfs with only ``room`` bytes left (a filler file takes the rest): writes fail
  with ENOSPC part-way, as on a full data disk.
- ``read-only``: a tmpfs remounted ``ro``: every write fails with EROFS.
- ``immutable``: a folder on a tmpfs with ``chattr +i``: even root gets EPERM (tmpfs takes the
  flag since Linux 6.0; where it does not, the case is skipped, saying so).
- ``file-in-the-way``: a regular file where the output's parent folder should be: ENOTDIR.

Root ignores permission bits, so chmod makes no fault here. Each fault checks that it really
stops a write before it is handed out, and its mount is lazily unmounted (and the immutable
flag lifted) when the block ends, whether the test passed or failed.
"""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import pytest

FAULTS = ("full", "read-only", "immutable", "file-in-the-way")


def _run(*command: str) -> bool:
    return subprocess.run(command, capture_output=True).returncode == 0


@contextmanager
def tmpfs(mount: Path, size: str = "4m") -> Iterator[Path]:
    """A fresh tmpfs of ``size`` at ``mount`` (created), unmounted when the block ends."""
    mount.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not _run(
        "mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)
    ):
        pytest.skip("needs root to mount a tmpfs: the file-system faults are made with one")
    try:
        yield mount
    finally:
        _run("umount", "-l", str(mount))


def fill(folder: Path, room: int) -> None:
    """Leave about ``room`` bytes free on ``folder``'s file system."""
    stat = os.statvfs(folder)
    free = stat.f_bavail * stat.f_frsize
    with open(folder / ".filler", "wb") as handle:
        handle.write(b"\0" * max(0, free - room))


def _write_fails(folder: Path, size: int) -> bool:
    probe = folder / ".fault-probe"
    try:
        with open(probe, "wb") as handle:
            handle.write(b"\0" * size)
    except OSError:
        return True
    finally:
        with suppress(OSError):
            probe.unlink(missing_ok=True)
    return False


@contextmanager
def faulty_output(base: Path, fault: str, room: int = 64 * 1024) -> Iterator[Path]:
    """An output folder under ``base`` that cannot take a writer's files, by ``fault`` (one of
    ``FAULTS``). The folder exists (``full``, ``read-only``, ``immutable``; empty) or cannot be
    made (``file-in-the-way``)."""
    with ExitStack() as stack:
        mount = stack.enter_context(tmpfs(base / f"fs-{fault}"))
        out = mount / "out"
        if fault == "file-in-the-way":
            (mount / "blocker").write_text("a file, not a folder\n")
            out = mount / "blocker" / "out"
            assert _write_fails(mount / "blocker", 1)
        else:
            out.mkdir()
        if fault == "full":
            fill(mount, room)
            assert _write_fails(out, 2 * room + (1 << 20))
        elif fault == "read-only":
            assert _run("mount", "-o", "remount,ro", str(mount)), "remount ro failed"
            assert _write_fails(out, 1)
        elif fault == "immutable":
            if not _run("chattr", "+i", str(out)):
                pytest.skip("this kernel's tmpfs does not take chattr +i (Linux 6.0 or later)")
            stack.callback(_run, "chattr", "-i", str(out))
            assert _write_fails(out, 1)
        elif fault != "file-in-the-way":
            raise ValueError(f"fault {fault!r}: one of {', '.join(FAULTS)}")
        yield out


def leftovers(folder: Path) -> list[str]:
    """Files a failed writer left in ``folder`` that a reader could take for output: temp
    files (``.*.partial-*``) and anything that is not the test's own filler."""
    if not folder.is_dir():
        return []
    return sorted(
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and path.name not in (".filler",)
    )


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` refuses writes for the block: immutable as root (even root gets EPERM),
    otherwise mode 555."""
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
