"""The scaling sweep's report: figures against values worked out by hand, and its files."""

from __future__ import annotations

import json

import pytest

from dt_commands.jobs.sweep_report import (
    LOCAL_COST,
    ReportError,
    Run,
    Sweep,
    markdown,
    steady_rate,
    write,
)
from trainer.watch.noise_scale import advice

H100 = "Standard_ND96isr_H100_v5"  # $98.32 per node-hour in infra/prices.py (2026-11)


def _pool_sweep(**changes) -> Sweep:
    """1, 2 and 4 nodes of 8 GPUs at 100, 180 and 300 images/s; epochs of 36,000 images."""
    values = dict(
        title="stack dev, job default",
        axis="nodes",
        unit="images",
        epoch_samples=36_000,
        runs=(Run(4, 32, 300.0, 200), Run(1, 8, 100.0, 200), Run(2, 16, 180.0, 200)),
        vm_size=H100,
    )
    return Sweep(**{**values, **changes})


def test_rows_give_per_worker_rates_efficiency_epoch_time_and_cost_worked_by_hand():
    rows = _pool_sweep().rows()
    assert [row["nodes"] for row in rows] == [1, 2, 4]  # smallest first, whatever the order
    # Per GPU: 100/8, 180/16, 300/32.
    assert [row["images_per_sec_per_worker"] for row in rows] == [12.5, 11.25, 9.375]
    # Against 12.5 per GPU on one node.
    assert [row["efficiency"] for row in rows] == [1.0, 0.9, 0.75]
    # 36,000 images at 100, 180, 300 images/s.
    assert [row["epoch_seconds"] for row in rows] == [360.0, 200.0, 120.0]
    # 98.32 $/node-hour x 1 node x 0.1 h; x 2 nodes x 200/3600 h; x 4 nodes x 120/3600 h.
    costs = [row["cost_per_epoch_usd"] for row in rows]
    assert costs == pytest.approx([9.832, 10.924444, 13.109333])


def test_markdown_shows_the_table_the_price_source_and_the_largest_runs_noise_advice():
    line = advice(4096.0, 512)
    runs = (Run(1, 8, 100.0, 200, advice(900.0, 256)), Run(2, 16, 180.0, 200, line))
    text = markdown(_pool_sweep(runs=runs))
    assert "| nodes | workers | images/s | images/s per worker | efficiency |" in text
    assert "| 1 | 8 | 100.0 | 12.5 | 1.00 | 6.0 min | $9.83 |" in text
    assert "| 2 | 16 | 180.0 | 11.2 | 0.90 | 3.3 min | $10.92 |" in text
    assert f"Cost per epoch: {H100} at $98.32 per node-hour" in text
    assert f"Gradient noise scale: {line}." in text  # 2 nodes: the larger global batch
    assert "![epoch duration and efficiency against workers](scaling.png)" in text


def test_a_local_sweep_costs_nothing_and_a_size_without_a_price_says_so():
    local = Sweep("local", "workers", "images", 640, (Run(1, 1, 64.0, 12), Run(2, 2, 96.0, 12)))
    rows = local.rows()
    assert [row["cost_per_epoch_usd"] for row in rows] == [None, None]
    assert [row["efficiency"] for row in rows] == [1.0, 0.75]  # 48 per worker against 64
    assert [row["epoch_seconds"] for row in rows] == [10.0, 640 / 96]
    assert "(1.00 is linear scaling). No cost: local run.\n" in markdown(local)
    assert LOCAL_COST == "no cost: local run"
    unknown = _pool_sweep(vm_size="Standard_Unknown")
    assert {row["cost_per_epoch_usd"] for row in unknown.rows()} == {None}
    assert "Standard_Unknown is not in the price table" in unknown.cost_note


def test_the_steady_rate_leaves_out_the_warm_up_window_and_counts_tokens_for_language_models():
    records = [
        {"kind": "train", "step": 10, "images_per_sec_total": 5.0},  # warm-up
        {"kind": "noise", "step": 10, "noise_scale": 7.0, "global_batch": 16},
        {"kind": "train", "step": 20, "images_per_sec_total": 40.0},
        {"kind": "train", "step": 30, "images_per_sec_total": 44.0},
        {"kind": "train", "step": 40, "images_per_sec_total": 41.0},
        {"kind": "eval", "step": 40, "val_loss": 1.0},
    ]
    assert steady_rate(records) == (41.0, "images")
    tokens = [{"kind": "train", "step": 1, "tokens_per_sec_total": 900.0}]
    assert steady_rate(tokens) == (900.0, "tokens")  # one window: nothing to leave out
    run, unit = Run.from_records(2, 2, records, "workers=2")
    assert (run.samples_per_sec, run.steps, unit) == (41.0, 40, "images")
    assert run.noise_advice == advice(7.0, 16)


def test_a_run_without_a_logged_rate_is_a_one_line_error_naming_it():
    with pytest.raises(ReportError, match=r"^workers=2: no training step logged a rate"):
        Run.from_records(2, 2, [{"kind": "noise", "step": 2}], "workers=2")


def test_write_puts_the_three_files_in_place_at_once(tmp_path):
    folder = write(_pool_sweep(), tmp_path / "report")
    assert sorted(p.name for p in folder.iterdir()) == ["report.json", "report.md", "scaling.png"]
    assert (folder / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((folder / "report.json").read_text())
    assert [row["efficiency"] for row in data["rows"]] == [1.0, 0.9, 0.75]
    assert data["cost"].startswith(f"{H100} at $98.32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no temp folder left


def test_a_report_that_cannot_be_written_leaves_nothing_behind(tmp_path):
    parent = tmp_path / "a-file"
    parent.write_text("")
    with pytest.raises(ReportError, match=r"^report=.*a-file/report: cannot write it"):
        write(_pool_sweep(), parent / "report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
