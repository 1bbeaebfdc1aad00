"""The multi-node launcher under faults (two simulated Batch nodes on 127.0.0.1)."""

import os
import subprocess
import sys
import time

import psutil

from tests.faults.conftest import read_only
from tests.parallel.conftest import read_metrics
from tests.parallel.launch_nodes import batch_env, free_port, start_nodes, trainer_command


def _logs(tmp_path):
    return "\n".join((tmp_path / f"node{i}.log").read_text() for i in (0, 1))


def test_a_dead_worker_on_one_node_ends_both_nodes_non_zero_within_60s(tmp_path):
    out = tmp_path / "run"
    nodes = start_nodes(tmp_path, trainer_command(out, "--epochs", "200", "--log-every", "1"))
    deadline = time.monotonic() + 90
    while not read_metrics(out):  # training has started on both nodes
        assert time.monotonic() < deadline, _logs(tmp_path)
        assert all(node.poll() is None for node in nodes), _logs(tmp_path)
        time.sleep(0.2)
    psutil.Process(nodes[1].pid).children()[0].kill()
    for node in nodes:
        node.wait(timeout=60)
    assert all(node.returncode != 0 for node in nodes), _logs(tmp_path)
    logs = _logs(tmp_path)
    assert "[launch 127.0.0.2] node 127.0.0.2 worker 0 exited with -9" in logs
    # Node 1 stops either through the launchers' store or because its worker saw the peer go.
    assert (
        "[launch 127.0.0.1] node 127.0.0.2 worker 0 exited with -9: stopping" in logs
        or "[launch 127.0.0.1] node 127.0.0.1 worker 0 exited with 1" in logs
    )
    assert "Traceback" not in logs


def test_a_dead_master_launcher_ends_the_other_node(tmp_path):
    out = tmp_path / "run"
    nodes = start_nodes(tmp_path, trainer_command(out, "--epochs", "200", "--log-every", "1"))
    deadline = time.monotonic() + 90
    while not read_metrics(out):
        assert time.monotonic() < deadline, _logs(tmp_path)
        time.sleep(0.2)
    master = psutil.Process(nodes[0].pid)
    orphans = master.children(recursive=True)
    master.kill()  # the node (and its rendezvous store) vanishes
    for orphan in orphans:
        orphan.kill()
    nodes[1].wait(timeout=60)
    assert nodes[1].returncode != 0
    assert "stopped answering" in _logs(tmp_path) or "exited with" in _logs(tmp_path)


def test_an_unwritable_run_folder_fails_fast_in_one_line_before_any_worker_starts(tmp_path):
    share = tmp_path / "share"  # the NFS export, not writable by the task's user
    share.mkdir()
    output_dir = share / "runs" / "dev"
    marker = tmp_path / "worker-started"
    worker = [sys.executable, "-c", f"open({str(marker)!r}, 'w')", "--output-dir", str(output_dir)]
    env = {**os.environ, **batch_env(0, free_port(), free_port())}
    env["AZ_BATCH_HOST_LIST"] = "127.0.0.1"
    launch = [sys.executable, "-m", "trainer.launch", "--workers-per-node", "1", "--", *worker]
    with read_only(share):
        started = time.monotonic()
        result = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"error: output_dir={output_dir}: cannot create or write it as uid" in result.stderr
    assert "writable for the task's user" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists() and elapsed < 30
