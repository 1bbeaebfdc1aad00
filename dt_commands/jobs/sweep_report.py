"""The scaling sweep's report (``dt-jobs sweep``): a folder with report.md, report.json and
scaling.png, from the steady throughput each run measured.

Per worker count: samples/s (images, or a language model's tokens) in total and per worker
(one worker per GPU on a pool), the scaling efficiency against the smallest count, the epoch
duration those rates give, and what an epoch costs at the price table's pay-as-you-go rate
(``infra.prices``). The figure is the one the Azure scaling study of this architecture plots:
epoch duration against workers, with the efficiency beside it.

Torch-free: the operator CLI runs where `pulumi up` runs.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infra import prices
from infra.live_metrics import noise_advice, number, rate_key, train_records

LOCAL_COST = "no cost: local run"


class ReportError(RuntimeError):
    """A run left nothing to measure, or the report cannot be written (exit code 1)."""

    code = 1


def steady_rate(records: Sequence[dict[str, Any]]) -> tuple[float, str] | None:
    """(samples/s of all workers, unit): the median over the logged training windows after
    the first, which carries the warm-up (first steps, allocator, rendezvous); None when no
    window logged a rate."""
    train = train_records(list(records))
    unit, key = rate_key(train)
    rates = [rate for r in train if (rate := number(r, key)) is not None]
    if not rates:
        return None
    return statistics.median(rates[1:] or rates), unit


@dataclass(frozen=True)
class Run:
    """One run of the sweep, as measured."""

    count: int  # what the sweep varied: nodes on a pool, workers locally
    workers: int  # training processes (one per GPU on a pool)
    samples_per_sec: float  # steady rate of all workers together
    steps: int  # the last logged step
    noise_advice: str | None = None

    @classmethod
    def from_records(
        cls, count: int, workers: int, records: Sequence[dict[str, Any]], where: str
    ) -> tuple[Run, str]:
        """The run and its unit from its metrics records; ``where`` names the run in errors."""
        measured = steady_rate(records)
        if measured is None:
            raise ReportError(
                f"{where}: no training step logged a rate; give more --steps than the "
                "trainer's --log-every"
            )
        rate, unit = measured
        last = train_records(list(records))[-1]["step"]
        return cls(count, workers, rate, last, noise_advice(list(records))), unit


@dataclass(frozen=True)
class Sweep:
    """What the report says about a set of runs."""

    title: str  # the stack and job, or the local run's settings
    axis: str  # "nodes" (a pool) or "workers" (local)
    unit: str  # images | tokens
    epoch_samples: int  # samples in one epoch (all workers together)
    runs: tuple[Run, ...]
    vm_size: str | None = None  # None: a local run, which costs nothing

    @property
    def node_price(self) -> float | None:
        """USD per node-hour at the price table's pay-as-you-go rate; None if unknown."""
        return None if self.vm_size is None else prices.VM_PER_HOUR.get(self.vm_size)

    @property
    def cost_note(self) -> str:
        if self.vm_size is None:
            return LOCAL_COST
        if self.node_price is None:
            return f"no cost: {self.vm_size} is not in the price table (infra/prices.py)"
        return (
            f"{self.vm_size} at ${self.node_price:g} per node-hour, pay-as-you-go list price "
            f"(East US, {prices.PRICES_AS_OF}); Spot and reservations cost less"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per run, smallest count first: the figures of the table and the plot."""
        runs = sorted(self.runs, key=lambda r: r.count)
        base = runs[0]
        base_per_worker = base.samples_per_sec / base.workers
        price = self.node_price
        rows = []
        for run in runs:
            per_worker = run.samples_per_sec / run.workers
            epoch_seconds = self.epoch_samples / run.samples_per_sec
            nodes = run.count if self.axis == "nodes" else None
            cost = None
            if price is not None and nodes is not None:
                cost = price * nodes * epoch_seconds / 3600
            rows.append(
                {
                    self.axis: run.count,
                    "workers": run.workers,
                    "steps": run.steps,
                    f"{self.unit}_per_sec": run.samples_per_sec,
                    f"{self.unit}_per_sec_per_worker": per_worker,
                    # Per-worker rate against the smallest run's: 1.0 is linear scaling.
                    "efficiency": per_worker / base_per_worker,
                    "epoch_seconds": epoch_seconds,
                    "cost_per_epoch_usd": cost,
                }
            )
        return rows

    @property
    def advice(self) -> str | None:
        """The largest run's noise-scale advice (its global batch is the one that matters)."""
        measured = [r for r in sorted(self.runs, key=lambda r: r.count) if r.noise_advice]
        return measured[-1].noise_advice if measured else None


def _duration_unit(seconds: float) -> tuple[str, float]:
    """The unit a duration reads best in (hours, minutes or seconds) and its seconds."""
    for name, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return name, size
    return "s", 1.0


def _duration(seconds: float) -> str:
    unit, size = _duration_unit(seconds)
    return f"{seconds / size:.{2 if unit == 'h' else 1}f} {unit}"


def markdown(sweep: Sweep) -> str:
    unit, axis = sweep.unit, sweep.axis
    note = sweep.cost_note
    pricing = f"Cost per epoch: {note}" if sweep.node_price else note[0].upper() + note[1:]
    header = [axis, *(["workers"] if axis == "nodes" else [])]
    header += [f"{unit}/s", f"{unit}/s per worker", "efficiency", "epoch", "cost per epoch"]
    lines = [
        f"# Scaling sweep: {sweep.title}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in sweep.rows():
        cost = row["cost_per_epoch_usd"]
        cells = [str(row[axis]), *([str(row["workers"])] if axis == "nodes" else [])]
        cells += [
            f"{row[f'{unit}_per_sec']:,.1f}",
            f"{row[f'{unit}_per_sec_per_worker']:,.1f}",
            f"{row['efficiency']:.2f}",
            _duration(row["epoch_seconds"]),
            "-" if cost is None else f"${cost:,.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"An epoch is {sweep.epoch_samples:,} {unit}. Rates are the median of the logged "
        "windows after the first (warm-up). Efficiency: the per-worker rate against the "
        f"smallest run's (1.00 is linear scaling). {pricing}.",
        "",
    ]
    if sweep.advice:
        lines += [f"Gradient noise scale: {sweep.advice}.", ""]
    lines += ["![epoch duration and efficiency against workers](scaling.png)", ""]
    return "\n".join(lines)


def plot(sweep: Sweep, path: Path) -> None:
    """Epoch duration against workers (the study's figure) and the efficiency beside it."""
    import matplotlib

    matplotlib.use("Agg")  # no screen where the CLI runs
    import matplotlib.pyplot as plt

    rows = sweep.rows()
    workers = [row["workers"] for row in rows]
    seconds = [row["epoch_seconds"] for row in rows]
    unit, scale = _duration_unit(max(seconds))
    durations = [value / scale for value in seconds]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(workers, durations, marker="o", label="measured")
    # Linear scaling from the smallest run: what perfect efficiency would give.
    left.plot(
        workers,
        [durations[0] * workers[0] / w for w in workers],
        linestyle="--",
        color="grey",
        label="linear scaling",
    )
    left.set(
        xlabel="workers",
        ylabel=f"epoch duration ({unit})",
        xticks=workers,
        ylim=(0, None),
        title="Epoch duration",
    )
    left.legend()
    right.plot(workers, [row["efficiency"] for row in rows], marker="o")
    right.axhline(1.0, color="grey", linestyle="--")
    right.set(
        xlabel="workers",
        ylabel="scaling efficiency",
        xticks=workers,
        ylim=(0, 1.1),
        title="Efficiency against the smallest run",
    )
    figure.suptitle(sweep.title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def as_json(sweep: Sweep) -> dict[str, Any]:
    return {
        "title": sweep.title,
        "axis": sweep.axis,
        "unit": sweep.unit,
        "epoch_samples": sweep.epoch_samples,
        "vm_size": sweep.vm_size,
        "cost": sweep.cost_note,
        "noise_scale_advice": sweep.advice,
        "rows": sweep.rows(),
        "runs": [asdict(run) for run in sorted(sweep.runs, key=lambda r: r.count)],
    }


def write(sweep: Sweep, folder: Path) -> Path:
    """The report in ``folder`` (which must not exist), all or nothing: it is written in a
    temporary sibling folder that is renamed into place once complete."""
    temp = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    try:
        temp.mkdir(parents=True)
        (temp / "report.md").write_text(markdown(sweep), encoding="utf-8")
        (temp / "report.json").write_text(json.dumps(as_json(sweep), indent=2) + "\n")
        plot(sweep, temp / "scaling.png")
        temp.rename(folder)
    except OSError as err:
        raise ReportError(
            f"report={folder}: cannot write it ({err.strerror or err}); give a writable --report"
        ) from None
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return folder
