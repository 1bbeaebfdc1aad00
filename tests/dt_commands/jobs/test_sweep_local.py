"""``dt-jobs sweep --local``, end to end: the CLI runs the trainer under the node launcher on 1
and 2 CPU workers and writes the report from what the runs logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

REPO = Path(__file__).resolve().parents[3]
STEPS = 6
TINY = [
    *("--model", "tiny", "--num-classes", "5", "--image-size", "16", "--batch-size", "8"),
    *("--synthetic-size", "640", "--synthetic-pool", "32", "--warmup-epochs", "0"),
    *("--log-every", "2", "--noise-scale-every", "2"),
]


def test_a_local_sweep_runs_one_to_two_workers_and_reports_their_scaling(tmp_path):
    report, temp = tmp_path / "report", tmp_path / "tmp"
    temp.mkdir()
    command = [sys.executable, "-m", "dt_commands.jobs", "sweep", "--local", "--workers", "2,1"]
    command += ["--steps", str(STEPS), "--report", str(report), *TINY]
    result = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == f"report: {report}/report.md"
    data = json.loads((report / "report.json").read_text())
    rows = data["rows"]
    assert [(row["workers"], row["steps"]) for row in rows] == [(1, STEPS), (2, STEPS)]
    one, two = (row["images_per_sec"] for row in rows)
    assert one > 0 and two > 0
    assert rows[1]["images_per_sec_per_worker"] == two / 2
    assert rows[1]["efficiency"] == (two / 2) / one
    assert [row["epoch_seconds"] for row in rows] == [640 / one, 640 / two]
    assert data["cost"] == "no cost: local run"
    # The two-worker run measured the noise scale (one worker cannot: it is left out there).
    assert data["noise_scale_advice"].startswith("global batch 16, noise scale ~ ")
    text = (report / "report.md").read_text()
    assert "| 2 | " in text and "No cost: local run." in text
    assert (report / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert list(temp.glob("sweep-*")) == []  # the runs' folders went with the sweep
