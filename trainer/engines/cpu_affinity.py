"""``--cpu-affinity``: each rank of a node keeps to its own share of the node's CPUs.
Why it is built this way: docs/internals.md, `trainer/engines/cpu_affinity.py`."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def cpu_share(local_rank: int, local_size: int, available: set[int]) -> list[int] | None:
    """The CPUs of ``local_rank`` out of ``available`` split into ``local_size`` contiguous,
    disjoint slices as equal as can be (the first slices one CPU larger when they do not divide
    evenly); None when there are fewer CPUs than ranks, which cannot each have their own."""
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local rank {local_rank} outside 0..{local_size - 1}")
    cpus = sorted(available)
    if len(cpus) < local_size:
        return None
    size, larger = divmod(len(cpus), local_size)
    start = local_rank * size + min(local_rank, larger)
    return cpus[start : start + size + (local_rank < larger)]


def each_thread(action: Callable[[int], T]) -> dict[int, T]:
    """``action(thread id)`` for every thread of this process (the kernel's ids: each takes its
    own CPU mask), by id. A thread that ends between the listing and its action is left out:
    the action then finds it gone (``ProcessLookupError``, or ``FileNotFoundError`` for its
    ``/proc/self/task`` entry)."""
    results = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            results[int(task.name)] = action(int(task.name))
        except (ProcessLookupError, FileNotFoundError):
            continue
    return results


def bind_process(cpus: list[int]) -> None:
    """Bind every thread of this process to ``cpus`` (threads started later inherit it)."""
    each_thread(lambda thread: os.sched_setaffinity(thread, cpus))


def bind_local_rank(local_rank: int, local_size: int) -> list[int] | None:
    """Bind this process to its rank's share; the share, or None when it stays unbound."""
    available = os.sched_getaffinity(0)
    share = cpu_share(local_rank, local_size, available)
    if share is None:
        log.warning(
            "cpu_affinity: %d ranks on %d CPUs cannot each have their own; left unbound",
            local_size,
            len(available),
        )
        return None
    bind_process(share)
    return share
