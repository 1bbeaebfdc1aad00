"""The multi-node launcher under faults (two simulated Batch nodes on 127.0.0.1)."""

import time

import psutil

from tests.parallel.conftest import read_metrics
from tests.parallel.launch_nodes import start_nodes, trainer_command


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
