"""The performance goals, each beside what the saved results measured: Horovod's 2-worker
efficiency against DDP's, in absolute terms and against the run's ceiling, and its throughput
against DDP's (``bench.scaling``), the data path's images/s per core against the folder path
before (``bench.data_path``), and the decoded cache's memory per node (``bench.cache_memory``).
``make bench`` prints this last, from the files its run wrote; a result file older than the run
is named as such, never passed off as this run's.

    .venv/bin/python -m bench.goals
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cache_memory import GOAL_COPIES
from bench.common import RESULTS
from bench.data_path import GOAL_SPEEDUP, SCALED_SHORT_SIDE
from bench.scaling import CEILING_GOAL, EFFICIENCY_GOAL, PARITY_GOAL, THROUGHPUT_GOAL

PAGE_SLACK_COPIES = 0.005


@dataclass(frozen=True)
class Goal:
    name: str
    measured: float | None  # None: the result file is missing or from an earlier run
    target: float
    at_least: bool  # True: measured >= target meets it; False: measured <= target
    slack: float = 0.0  # how far past the target still meets it, for a known rounding

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        if self.at_least:
            return self.measured >= self.target - self.slack
        return self.measured <= self.target + self.slack


def _results(name: str, since: float | None, results: Path) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    if not path.exists() or (since is not None and path.stat().st_mtime < since):
        return None
    return json.loads(path.read_text())


def goals(since: float | None = None, results: Path = RESULTS) -> list[Goal]:
    """The goals from the result files written at or after ``since`` (a time.time() value)."""
    scaling = _results("scaling", since, results)
    data = _results("data_path", since, results)
    cache = _results("cache_memory", since, results)
    rows = scaling["results"] if scaling else {}
    horovod = rows["horovod"]["efficiency"] if rows else None
    ddp = rows["ddp"]["efficiency"] if rows else None
    ceiling = rows["independent"]["efficiency"] if rows else None
    throughput = f"images_per_sec_{scaling['workers']}" if scaling else ""
    speedup = data["speedup_vs_folder"] if data else {}
    copies = cache["copies"] if cache else {}
    return [
        Goal(
            "Horovod 2-worker efficiency / DDP's",
            horovod / ddp if horovod is not None and ddp else None,
            PARITY_GOAL,
            True,
        ),
        Goal("Horovod 2-worker efficiency", horovod, EFFICIENCY_GOAL, True),
        Goal(
            "Horovod 2-worker efficiency / the run's ceiling",
            horovod / ceiling if horovod is not None and ceiling else None,
            CEILING_GOAL,
            True,
        ),
        Goal(
            "Horovod 2-worker images/s / DDP's",
            rows["horovod"][throughput] / rows["ddp"][throughput] if rows else None,
            THROUGHPUT_GOAL,
            True,
        ),
        Goal(
            f"data path per core, {SCALED_SHORT_SIDE} px shards / folder before",
            speedup.get(f"shards_{SCALED_SHORT_SIDE}"),
            GOAL_SPEEDUP,
            True,
        ),
        Goal(
            "data path per core, default shards / folder before",
            speedup.get("shards"),
            GOAL_SPEEDUP,
            True,
        ),
        # tmpfs allocates whole pages: each cache file may hold up to 4 KiB more than its
        # samples, about 0.001 copies of bench.cache_memory's dataset per file.
        *(
            Goal(
                f"decoded cache per node, scope {scope} (copies)",
                copies.get(scope),
                GOAL_COPIES,
                False,
                slack=PAGE_SLACK_COPIES,
            )
            for scope in ("node", "rank")
        ),
    ]


def report(found: list[Goal]) -> str:
    lines = [f"{'goal':<58}{'measured':>10}{'target':>10}  met"]
    for goal in found:
        sign = ">=" if goal.at_least else "<="
        measured = "-" if goal.measured is None else f"{goal.measured:.3f}"
        verdict = {True: "yes", False: "NO", None: "not measured in this run"}[goal.met]
        lines.append(f"{goal.name:<58}{measured:>10}{sign:>4}{goal.target:>6.2f}  {verdict}")
    return "\n".join(lines)


def main() -> None:
    print(report(goals()))


if __name__ == "__main__":
    main()
