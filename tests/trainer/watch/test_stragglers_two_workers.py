"""Two real Horovod workers on 127.0.0.1: a rank with a slow data loader is named, with its
host and by how much; a run without one names nobody at the default margin."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.launchers import REPO, horovodrun, paced_trainer, read_metrics, small_config

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

# 2 epochs of 8 steps, the ranks' times shared every 4 steps: 4 windows.
EVERY = 4


def train(tmp_path, slow_rank: str, seconds: float = 0.0):
    out = tmp_path / "out"
    config = small_config(out, backend="horovod", straggler_every=EVERY, log_every=8)
    command = horovodrun(*paced_trainer(config, seconds, ranks=slow_rank))
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "results" / "metrics.json").read_text())
    return out, result.stdout + result.stderr, summary


def test_a_rank_with_a_slow_loader_is_named_with_its_host_and_margin(tmp_path):
    out, output, summary = train(tmp_path, slow_rank="1", seconds=0.15)
    host = socket.gethostname()
    records = [r for r in read_metrics(out) if r.get("kind") == "straggler"]
    assert records, output[-3000:]
    assert {(r["rank"], r["host"], r["metric"]) for r in records} == {(1, host, "data_wait_sec")}
    assert all(r["excess_of_step"] > 0.5 and r["seconds"] >= 0.15 for r in records)
    assert f"straggler: rank 1 on {host}: data_wait_sec" in output
    [entry] = summary["stragglers"]
    assert (entry["rank"], entry["host"], entry["of_windows"]) == (1, host, 4)
    scalars = EventAccumulator(str(out / "tensorboard")).Reload().Tags()["scalars"]
    for rank in (0, 1):
        for name in ("step_sec", "data_wait_sec", "compute_sec"):
            assert f"ranks/{name}/rank{rank}" in scalars


def test_a_run_without_a_slow_rank_names_none(tmp_path):
    out, output, summary = train(tmp_path, slow_rank="none")
    assert [r for r in read_metrics(out) if r.get("kind") == "straggler"] == []
    assert summary["stragglers"] == [] and "straggler" not in output
    assert not [r for r in read_metrics(out) if r.get("kind") == "gpu"]  # CPUs: no samples
