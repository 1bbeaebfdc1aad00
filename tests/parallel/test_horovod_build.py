"""The Horovod the set-up installed is the build scripts/build_horovod.sh makes: PyTorch and
Gloo support, and the blocking-wait patch (scripts/horovod-blocking-wait.patch), both by its
marker and by what it changes: a rank waiting for a late peer sleeps instead of spinning."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.parallel.conftest import BIN, REPO, horovodrun


def test_the_installed_horovod_has_pytorch_gloo_and_the_blocking_wait():
    build = subprocess.run(
        [str(BIN / "horovodrun"), "--check-build"], capture_output=True, text=True, timeout=60
    )
    assert "[X] PyTorch" in build.stdout and "[X] Gloo" in build.stdout
    marker = subprocess.run(
        [sys.executable, "-c", "from horovod.torch import mpi_lib_v2 as m; "
         "print(m.horovod_torch_wait_blocks())"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert marker.stdout.strip() == "1", marker.stderr


def test_a_rank_waiting_for_a_late_peer_does_not_spin(tmp_path):
    """An unpatched build spins in WaitAndClear (a yield() loop): about one core for the whole
    wait. Patched, the waiting process uses a small part of that (Horovod's own background
    thread still wakes every cycle)."""
    report_path = tmp_path / "wait.json"
    result = subprocess.run(
        horovodrun("-m", "tests.parallel.wait_probe", str(report_path)),
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(report_path.read_text())
    assert report["sum"] == 2.0 and report["wall"] > 1.5
    assert report["cpu"] < 0.5 * report["wall"], report
