"""The patches of the installed Horovod (scripts/horovod-patches/), each by what it changes: a
rank waiting for a late peer sleeps instead of spinning (01), a waiting caller or a full fusion
buffer starts the next cycle at once (02), an in-place allreduce copies nothing onto itself (03).
Their build and markers: tests/scripts/test_installed_horovod.py."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.launchers import REPO, horovodrun

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


def _probe(module: str, tmp_path, env: dict[str, str] | None = None, timeout: int = 120) -> dict:
    """``tests.scripts.MODULE`` run under horovodrun (two workers): rank 0's JSON report."""
    report_path = tmp_path / f"{module}.json"
    result = subprocess.run(
        horovodrun("-m", f"tests.scripts.{module}", str(report_path)),
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(report_path.read_text())


def test_a_rank_waiting_for_a_late_peer_does_not_spin(tmp_path):
    """An unpatched build spins in WaitAndClear (a yield() loop) in the caller's thread: about
    one core for the whole wait. Patched, that thread sleeps. Only the waiting thread is
    measured: Horovod's background thread runs its cycles either way, and on a busy machine
    they took 1.2 s of CPU in a 2 s wait (a fresh-clone CI's run)."""
    report = _probe("wait_probe", tmp_path)
    assert report["sum"] == 2.0 and report["wall"] > 1.5
    assert report["cpu"] < 0.1 * report["wall"], report


def test_a_waiting_caller_or_a_full_fusion_buffer_starts_the_cycle_and_nothing_else_does(tmp_path):
    """With a 5 s cycle (under Gloo's 30 s timeout, which a loop woken early may wait in its
    negotiation for the others' tick): five allreduces whose caller waits for each, and a polled
    one over the 1 MB fusion threshold, finish in a fraction of one cycle (unpatched, each waits
    for the next tick: the five together at least 20 s); a small one that nobody waits for is
    still left to the cycle."""
    env = {"HOROVOD_CYCLE_TIME": "5000", "HOROVOD_FUSION_THRESHOLD": "1048576"}
    report = _probe("wake_probe", tmp_path, env, timeout=300)
    assert report["waited"] < 2.5 and report["full_buffer"] < 2.5, report  # half a cycle
    assert report["small_done_early"] is False, report


def test_an_in_place_allreduce_copies_no_tensor_onto_itself(tmp_path):
    """Every memcpy of the tensor's size (a size nothing else here copies) is counted by a
    preloaded library: an out-of-place allreduce shows Horovod's copy is seen (input into
    output); an in-place one makes none of a buffer onto itself (unpatched: one per allreduce)
    and still sums."""
    counter = tmp_path / "memcpy_count.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-fno-builtin", "-o", str(counter),
         str(REPO / "tests/scripts/memcpy_count.c")],
        check=True, timeout=60,
    )  # fmt: skip
    env = {"LD_PRELOAD": str(counter), "MEMCPY_COUNT_BYTES": str(4 * 1_000_003)}
    report = _probe("inplace_probe", tmp_path, env)
    assert report["out_of_place"]["copies"] >= 1, report
    assert report["in_place"]["self_copies"] == 0 and report["sum"] == 2.0, report
