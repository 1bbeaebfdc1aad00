"""PNG plots from bench/results/*.json (matplotlib, no screen): throughput vs workers,
scaling efficiency, and the data path. docs/benchmarks.md shows them."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.common import RESULTS
from bench.scaling import EFFICIENCY_GOAL


def _load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def scaling() -> None:
    data = _load("scaling")
    if not data:
        return
    workers, rows = data["workers"], data["results"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for engine, row in rows.items():
        left.plot(
            [1, workers],
            [row["images_per_sec_1"], row[f"images_per_sec_{workers}"]],
            marker="o",
            label=engine,
        )
    left.plot([1, workers], [0, 0], alpha=0)
    left.set(
        xlabel="workers",
        ylabel="images/sec (total)",
        xticks=[1, workers],
        title="Throughput, ResNet-18 64 px, CPU + Gloo",
    )
    left.legend()
    names = list(rows)
    right.bar(names, [rows[n]["efficiency"] for n in names], color="tab:blue")
    right.axhline(
        EFFICIENCY_GOAL, color="tab:red", linestyle="--", label=f"goal {EFFICIENCY_GOAL:.2f}"
    )
    right.set(ylim=(0, 1.15), ylabel="scaling efficiency", title=f"{workers} workers")
    right.tick_params(axis="x", rotation=30)
    right.legend()
    figure.tight_layout()
    figure.savefig(RESULTS / "scaling.png", dpi=100)
    plt.close(figure)


def data_path() -> None:
    data = _load("data_path")
    if not data:
        return
    rates = data["images_per_sec"]
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.bar(list(rates), list(rates.values()), color="tab:green")
    for index, (name, rate) in enumerate(rates.items()):
        axis.text(index, rate, f"{data['speedup_vs_folder'][name]:.1f}x", ha="center", va="bottom")
    axis.set(ylabel="images/sec on one core", title=f"Decode + augment, {data['image_size']} px")
    figure.tight_layout()
    figure.savefig(RESULTS / "data_path.png", dpi=100)
    plt.close(figure)


def main() -> None:
    scaling()
    data_path()
    print(f"plots in {RESULTS}: " + ", ".join(sorted(p.name for p in RESULTS.glob("*.png"))))


if __name__ == "__main__":
    main()
