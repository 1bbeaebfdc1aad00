"""Which rank holds the others up (``--straggler-every``, ``--straggler-margin``).

Each rank times its own steps: the wall time of a step, the part of it spent waiting for the
data loader, and, where the engine shows it (Horovod: ``Dist.reduction_wait_sec``), the part
spent waiting for the other ranks' gradients. Every N steps one small allreduce shares the
window's medians (and the rank's GPU sample, ``trainer.watch.gpu_telemetry``) with every rank.

In synchronous data parallelism every rank's step ends together, so the wall time alone never
names a straggler: the slow rank is the one that waits *least* for the others. A rank is named
when its data wait, or its own work (the step less its data and reduction waits), exceeds the
other ranks' median by more than ``margin`` of their median step. Medians over the window and
over the other ranks keep one slow step, or one slow rank among many, from moving the bar.
Imports torch only; the ranks' host names are gathered once, when the watch starts.
"""

from __future__ import annotations

import math
import socket
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from trainer.engines.base import Dist

T = TypeVar("T")

# What each rank reports per window, in this order, before its GPU sample's fields.
TIMES = ("step_sec", "data_wait_sec", "compute_sec")


@dataclass
class StepClock:
    """This rank's per-step times over the current window (host clock, no device sync)."""

    clock: Callable[[], float] = time.perf_counter
    steps: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    computes: list[float] = field(default_factory=list)
    _last_end: float | None = None
    _wait: float = 0.0

    def batches(self, iterable: Iterable[T]) -> Iterator[T]:
        """``iterable``, with the time each item took to arrive added to the step's data wait."""
        iterator = iter(iterable)
        while True:
            started = self.clock()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._wait += self.clock() - started
            yield item

    def step_done(self, reduction_wait: float | None) -> None:
        """At the end of each optimizer step; ``reduction_wait``: the seconds this step waited
        for the other ranks' gradients, None where the engine does not show it."""
        now = self.clock()
        if self._last_end is not None:  # the first step's wall time includes the set-up
            step = now - self._last_end
            self.steps.append(step)
            self.waits.append(self._wait)
            if reduction_wait is not None:
                self.computes.append(max(0.0, step - self._wait - reduction_wait))
        self._last_end, self._wait = now, 0.0

    def take(self) -> list[float]:
        """The window's medians in ``TIMES`` order (NaN: not measured); the window restarts."""
        medians = [
            statistics.median(values) if values else math.nan
            for values in (self.steps, self.waits, self.computes)
        ]
        self.steps, self.waits, self.computes = [], [], []
        return medians


@dataclass(frozen=True)
class Straggler:
    """One rank slower than the others in one window."""

    step: int
    rank: int
    host: str
    metric: str  # "data_wait_sec" or "compute_sec"
    seconds: float  # this rank's median
    others_sec: float  # the other ranks' median of the same time
    excess_of_step: float  # (seconds - others_sec) / the other ranks' median step time

    def record(self) -> dict[str, Any]:
        return {"kind": "straggler", **self.__dict__}

    def line(self) -> str:
        return (
            f"straggler: rank {self.rank} on {self.host}: {self.metric} {self.seconds:.3f}s per "
            f"step against {self.others_sec:.3f}s on the other ranks (median), "
            f"{self.excess_of_step:.0%} of a step slower (step {self.step})"
        )


def find_stragglers(
    step: int, hosts: list[str], rows: list[list[float]], margin: float
) -> list[Straggler]:
    """The ranks whose data wait or own work exceed the other ranks' median by more than
    ``margin`` of the other ranks' median step time. ``rows``: every rank's ``TIMES``."""
    found = []
    for rank, row in enumerate(rows):
        others = [r for i, r in enumerate(rows) if i != rank]
        others_step = _median(r[0] for r in others)
        if not others_step > 0:
            continue
        for column, metric in ((1, "data_wait_sec"), (2, "compute_sec")):
            mine, theirs = row[column], _median(r[column] for r in others)
            if math.isnan(mine) or math.isnan(theirs):
                continue
            excess = (mine - theirs) / others_step
            if excess > margin:
                found.append(Straggler(step, rank, hosts[rank], metric, mine, theirs, excess))
    return found


def _median(values: Iterable[float]) -> float:
    present = [v for v in values if not math.isnan(v)]
    return statistics.median(present) if present else math.nan


@dataclass
class StragglerSummary:
    """Over the run: per named rank, the windows it was slow in and its worst excess."""

    windows: int = 0
    ranks: dict[tuple[int, str, str], dict[str, Any]] = field(default_factory=dict)

    def add(self, stragglers: list[Straggler]) -> None:
        self.windows += 1
        for s in stragglers:
            entry = self.ranks.setdefault(
                (s.rank, s.host, s.metric),
                {
                    "rank": s.rank,
                    "host": s.host,
                    "metric": s.metric,
                    "windows": 0,
                    "worst_excess_of_step": 0.0,
                },
            )
            entry["windows"] += 1
            entry["worst_excess_of_step"] = max(entry["worst_excess_of_step"], s.excess_of_step)

    def result(self) -> list[dict[str, Any]]:
        """JSON values for the run summary, each with the windows judged in all."""
        return [entry | {"of_windows": self.windows} for entry in self.ranks.values()]


class RankExchange:
    """Every ``every`` steps: one allreduce of every rank's window (``TIMES`` and the extra
    fields ``extra`` returns, such as the GPU sample); rank 0 logs what it shows."""

    def __init__(
        self,
        dist: Dist,
        device: torch.device,
        every: int,
        margin: float,
        extra: Callable[[], list[float]] | None = None,
        extra_width: int = 0,
    ) -> None:
        self.dist, self.device, self.every, self.margin = dist, device, every, margin
        self.extra, self.extra_width = extra, extra_width
        self.clock = StepClock()
        self.summary = StragglerSummary()
        self.named: set[tuple[int, str]] = set()
        # Once: each rank's node, so a 64-node job's operator knows which one to look at.
        self.hosts: list[str] = dist.allgather_object(socket.gethostname())

    def batches(self, iterable: Iterable[T]) -> Iterator[T]:
        return self.clock.batches(iterable)

    def step_done(self, step: int) -> tuple[list[list[float]], list[Straggler]] | None:
        """After every optimizer step, on every rank (a collective every ``every`` steps):
        None, or every rank's row and the stragglers found."""
        self.clock.step_done(self.dist.take_reduction_wait())
        if step % self.every:
            return None
        width = len(TIMES) + self.extra_width
        table = torch.zeros(self.dist.size, width, dtype=torch.float64)
        mine = self.clock.take() + (self.extra() if self.extra else [])
        table[self.dist.rank] = torch.tensor(mine, dtype=torch.float64)
        rows = self.dist.allreduce_sum(table.to(self.device)).cpu().tolist()
        if self.dist.size < 2:
            return rows, []
        stragglers = find_stragglers(step, self.hosts, [r[: len(TIMES)] for r in rows], self.margin)
        self.summary.add(stragglers)
        return rows, stragglers

    def news(self, stragglers: list[Straggler]) -> list[Straggler]:
        """The stragglers not named in the previous window (a warning line each, not one per
        window while a rank stays slow)."""
        now = {(s.rank, s.metric) for s in stragglers}
        new = [s for s in stragglers if (s.rank, s.metric) not in self.named]
        self.named = now
        return new

    def scalars(self, rows: list[list[float]]) -> dict[str, float]:
        """Per-rank TensorBoard scalars: ``ranks/<time>/rank<N>``."""
        return {
            f"ranks/{name}/rank{rank}": row[i]
            for rank, row in enumerate(rows)
            for i, name in enumerate(TIMES)
            if not math.isnan(row[i])
        }
