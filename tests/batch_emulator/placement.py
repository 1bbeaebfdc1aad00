"""Which nodes a multi-instance task's try gets, and which of them is the master.

Batch documents that a retry may run on another node ("Resource files and application packages
are only downloaded again if the task is retried on a new compute node", TaskConstraints
.maxTaskRetryCount; a retried or requeued task's start event names its node again,
articles/batch/batch-task-start-event.md) and nothing about which nodes or which master a
retry gets. So the emulator has two readings: ``same``, every try on the first try's nodes with
the same master when they are all usable (the kind reading), and ``move``, the hard one: a
counted retry leaves out the node whose command failed, takes a node the task has not run on
in its place and puts the primary on a node that was not the master.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

PLACEMENTS = ("same", "move")


class _Node(Protocol):
    index: int


N = TypeVar("N", bound=_Node)


def place(
    usable: Sequence[N],
    instances: int,
    *,
    placement: str = "same",
    previous: Sequence[N] = (),
    failed: N | None = None,
) -> list[N] | None:
    """The try's nodes, the master last (the emulator lists the master last in
    AZ_BATCH_HOST_LIST, so nothing may assume the first host is the master); None when too few
    usable nodes. ``previous``: the last try's nodes (its master last); ``failed``: the node
    whose command failed in it (a counted retry follows)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r}: one of {PLACEMENTS}")
    if placement == "same" or failed is None or not previous:
        return list(usable[:instances]) if len(usable) >= instances else None
    return _moved(usable, instances, previous, failed)


def _moved(usable: Sequence[N], instances: int, previous: Sequence[N], failed: N) -> list[N] | None:
    """Without the failed node; the previous try's other nodes kept, new ones (never used by
    the previous try) added; the master a node that was not the previous master, a new one
    when there is one."""
    old_master = previous[-1]
    candidates = [n for n in usable if n is not failed]
    kept = [n for n in candidates if n in previous]
    fresh = [n for n in candidates if n not in previous]
    chosen = (kept + fresh)[:instances]  # kept has at most instances - 1 nodes
    if len(chosen) < instances:
        return None  # too few nodes without the failed one: wait, as Batch waits for nodes
    others = [n for n in chosen if n is not old_master]
    master = next((n for n in reversed(others) if n in fresh), others[-1])
    return [n for n in chosen if n is not master] + [master]
