"""The blocking-wait patch of the installed Horovod (scripts/horovod-blocking-wait.patch), by
what it changes: a rank waiting for a late peer sleeps instead of spinning (its build and
marker: tests/scripts/test_installed_horovod.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.launchers import REPO, horovodrun

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


def test_a_rank_waiting_for_a_late_peer_does_not_spin(tmp_path):
    """An unpatched build spins in WaitAndClear (a yield() loop): about one core for the whole
    wait. Patched, the waiting process uses a small part of that (Horovod's own background
    thread still wakes every cycle)."""
    report_path = tmp_path / "wait.json"
    result = subprocess.run(
        horovodrun("-m", "tests.scripts.wait_probe", str(report_path)),
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(report_path.read_text())
    assert report["sum"] == 2.0 and report["wall"] > 1.5
    assert report["cpu"] < 0.5 * report["wall"], report
