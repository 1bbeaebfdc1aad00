"""The multi-node launcher with two simulated nodes on 127.0.0.1 (two launcher processes)."""

import time

from tests.parallel.conftest import read_metrics
from tests.parallel.launch_nodes import start_nodes, trainer_command


def _wait_all(processes, timeout):
    deadline = time.monotonic() + timeout
    codes = []
    for process in processes:
        codes.append(process.wait(timeout=max(1, deadline - time.monotonic())))
    return codes


def _logs(tmp_path):
    return "\n".join((tmp_path / f"node{i}.log").read_text() for i in (0, 1))


def test_two_nodes_complete_a_two_rank_run(tmp_path):
    out = tmp_path / "run"
    nodes = start_nodes(
        tmp_path, trainer_command(out, "--epochs", "2", "--preflight-min-busbw", "0.0001")
    )
    assert _wait_all(nodes, 120) == [0, 0], _logs(tmp_path)
    logs = _logs(tmp_path)
    assert "node 1/2: starting 1 worker(s)" in logs and "node 2/2" in logs
    assert "preflight: allreduce bus bandwidth" in logs
    assert "done: step 8 (started at 0, stopped by epochs), 2 worker(s)" in logs
    assert read_metrics(out)[-1]["step"] == 8


def test_preflight_below_the_floor_stops_both_nodes_naming_the_slowest(tmp_path):
    nodes = start_nodes(
        tmp_path, trainer_command(tmp_path / "run", "--preflight-min-busbw", "100000")
    )
    codes = _wait_all(nodes, 120)
    assert all(code != 0 for code in codes)
    logs = _logs(tmp_path)
    assert "below the 100000 GB/s floor; slowest: node 127.0.0." in logs
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir()
    )


def test_sigterm_to_the_launchers_reaches_the_workers_which_checkpoint_and_exit_0(tmp_path):
    import signal

    out = tmp_path / "run"
    nodes = start_nodes(tmp_path, trainer_command(out, "--epochs", "200", "--log-every", "1"))
    deadline = time.monotonic() + 90
    while not read_metrics(out):
        assert time.monotonic() < deadline and all(n.poll() is None for n in nodes)
        time.sleep(0.2)
    for node in nodes:
        node.send_signal(signal.SIGTERM)
    assert _wait_all(nodes, 30) == [0, 0], _logs(tmp_path)
    assert "forwarding to the workers so they checkpoint" in _logs(tmp_path)
    assert any((out / "checkpoints").iterdir())
