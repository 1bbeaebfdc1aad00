"""Shared memory on a node: named segments in ``/dev/shm`` (``Segment``, one copy mapped by the
node's ranks and their loader workers) and the group of ranks sharing one (``NodeGroup``).
Naming, cleanup after SIGKILL and how a node's ranks find each other: docs/data.md, "How it
works".
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import mmap
import os
import secrets
import socket
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch

from trainer.data.errors import DataError

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
PREFIX = "trainer-cache"


class Collectives(Protocol):
    """What a ``NodeGroup`` needs of ``trainer.engines.base.Dist``."""

    rank: int

    def allgather_object(self, obj: Any) -> list[Any]: ...


def host_tag() -> str:
    """Eight hex digits naming this host: a segment's pid only means something on its host
    (containers sharing one /dev/shm have their own host names and pid namespaces)."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def own_prefix() -> str:
    """A new name prefix for segments this process creates and owns: the pid lets a later run
    remove them after a SIGKILL, the token keeps two runs on a node out of each other's."""
    return f"{PREFIX}-{host_tag()}-{os.getpid()}-{secrets.token_hex(6)}"


def _node_key(directory: Path) -> tuple[str, int]:
    """Ranks with the same host name and shared-memory device share a node."""
    try:
        device = os.stat(directory).st_dev
    except OSError:
        device = -1
    return socket.gethostname(), device


@dataclass
class NodeGroup:
    """The ranks (global rank numbers, ascending) that share this node's shared memory."""

    members: list[int]
    position: int  # this rank's index in ``members``
    prefix: str  # segment names of this group start with it
    dist: Collectives | None = None
    directory: Path = SHM_DIR

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def is_leader(self) -> bool:
        return self.position == 0

    @classmethod
    def alone(cls, directory: Path = SHM_DIR) -> NodeGroup:
        """A group of this process only (no collectives)."""
        return cls([0], 0, own_prefix(), None, directory)

    @classmethod
    def form(cls, dist: Collectives, directory: Path = SHM_DIR) -> NodeGroup:
        """The node's group; a collective: every rank of the job calls it."""
        mine = (_node_key(directory), os.getpid(), secrets.token_hex(6))
        every = dist.allgather_object(mine)
        members = [rank for rank, entry in enumerate(every) if entry[0] == mine[0]]
        _, leader_pid, token = every[members[0]]
        prefix = f"{PREFIX}-{host_tag()}-{leader_pid}-{token}"
        return cls(members, members.index(dist.rank), prefix, dist, directory)

    def gather(self, obj: Any) -> list[Any]:
        """Every member's ``obj`` in member order. A collective over all ranks of the job (the
        other nodes exchange theirs at the same time), so it is also the group's barrier."""
        if self.dist is None:
            return [obj]
        every = self.dist.allgather_object(obj)
        return [every[rank] for rank in self.members]

    def first_error(self, error: str | None) -> None:
        """Raise on every rank of the job when any rank reports an error, so none is left
        waiting in a collective for a rank that gave up."""
        every = [error] if self.dist is None else self.dist.allgather_object(error)
        found = next((e for e in every if e), None)
        if found:
            raise DataError(found)


def _owner_pid(name: str, host: str) -> int | None:
    parts = name.split("-")
    # trainer-cache-<host>-<pid>-<token>-<what...>
    if name.startswith(PREFIX + "-") and len(parts) >= 5 and parts[2] == host:
        try:
            return int(parts[3])
        except ValueError:
            return None
    return None


def remove_stale(directory: Path = SHM_DIR) -> list[Path]:
    """Remove this host's segments whose owner process is gone (a run killed by SIGKILL)."""
    host, removed = host_tag(), []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        pid = _owner_pid(name, host)
        if pid is None or psutil.pid_exists(pid):
            continue
        try:
            os.unlink(directory / name)
        except FileNotFoundError:
            continue
        removed.append(directory / name)
    if removed:
        log.info("removed %d shared-memory segment(s) left by dead runs", len(removed))
    return removed


def free_bytes(directory: Path = SHM_DIR) -> int:
    """Bytes that can still be written to ``directory`` (a container's /dev/shm is often
    small: 64 MiB under Docker unless started with --shm-size or --ipc=host)."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class Segment:
    """``size`` bytes of a file in shared memory, mapped read-write; ``tensor`` views them."""

    def __init__(self, path: Path, size: int, *, owner: bool) -> None:
        self.path, self.size, self.owner = path, size, owner
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise DataError(
                f"shared-memory segment {path} is gone: the rank that created it exited"
            ) from None
        try:
            # mmap of length 0 is refused; an empty cache maps one byte.
            self._map = mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED)
        finally:
            os.close(fd)  # the mapping keeps the file's pages; the descriptor is not needed
        self.tensor = torch.frombuffer(self._map, dtype=torch.uint8, count=max(size, 1))[:size]
        self._finalizer = weakref.finalize(self, _unlink, str(path)) if owner else None

    @classmethod
    def create(cls, path: Path, size: int) -> Segment:
        """A new segment, its memory reserved now: a full /dev/shm fails here with a DataError
        instead of killing a process with SIGBUS on a later write."""
        remove_stale(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(size, 1))
        except OSError as err:
            os.close(fd)
            _unlink(str(path))
            if err.errno in (errno.ENOSPC, errno.ENOMEM):
                raise DataError(
                    f"shared memory {path.parent} cannot hold {size / 2**30:.2f} GiB: give the "
                    "container more (--shm-size, --ipc=host) or use --cache bytes or none"
                ) from None
            raise
        os.close(fd)
        try:
            return cls(path, size, owner=True)
        except BaseException:
            _unlink(str(path))
            raise

    @classmethod
    def attach(cls, path: Path, size: int) -> Segment:
        return cls(path, size, owner=False)

    def close(self) -> None:
        """Unlink (the owner): processes that mapped it keep their pages until they unmap."""
        if self._finalizer is not None:
            self._finalizer()

    def __reduce__(self) -> tuple[Any, ...]:
        # A worker maps the same file by name: never the bytes, never the ownership.
        return (Segment.attach, (self.path, self.size))


def split(count: int, parts: int) -> Sequence[range]:
    """``range(count)`` cut into ``parts`` contiguous runs of nearly equal length."""
    return [range(count * k // parts, count * (k + 1) // parts) for k in range(parts)]


__all__ = [
    "PREFIX",
    "SHM_DIR",
    "NodeGroup",
    "Segment",
    "free_bytes",
    "host_tag",
    "own_prefix",
    "remove_stale",
    "split",
]
