"""The multi-node launcher under faults (two simulated Batch nodes on 127.0.0.1), and with the
torch.distributed engines (ddp, fsdp): the two launchers' workers form one process group."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.launchers import read_metrics
from tests.trainer.fs_faults import read_only
from tests.trainer.launch.launch_nodes import (
    batch_env,
    free_port,
    node_logs,
    start_nodes,
    trainer_command,
    wait_while_running,
)

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

# ``python -m trainer`` that also records what each worker was started with (see the file).
TORCH_WORKER = str(Path(__file__).with_name("torch_worker.py"))


def test_a_dead_worker_on_one_node_ends_both_nodes_non_zero_within_60s(tmp_path):
    out = tmp_path / "run"
    command = trainer_command(out, "--epochs", "200", "--log-every", "1")
    nodes = start_nodes(tmp_path, command, run_dir=out)
    wait_while_running(nodes, lambda: bool(read_metrics(out)), tmp_path)  # training started
    psutil.Process(nodes[1].pid).children()[0].kill()
    for node in nodes:
        node.wait(timeout=60)
    assert all(node.returncode != 0 for node in nodes), node_logs(tmp_path)
    logs = node_logs(tmp_path)
    assert "[launch 127.0.0.2] node 127.0.0.2 worker 0 exited with -9" in logs
    # Node 1 stops either through the launchers' store or because its worker saw the peer go.
    assert (
        "[launch 127.0.0.1] node 127.0.0.2 worker 0 exited with -9: stopping" in logs
        or "[launch 127.0.0.1] node 127.0.0.1 worker 0 exited with 1" in logs
    )
    assert "Traceback" not in logs


def test_a_dead_master_launcher_ends_the_other_node(tmp_path):
    out = tmp_path / "run"
    command = trainer_command(out, "--epochs", "200", "--log-every", "1")
    nodes = start_nodes(tmp_path, command, run_dir=out)
    wait_while_running(nodes, lambda: bool(read_metrics(out)), tmp_path)
    master = psutil.Process(nodes[0].pid)
    orphans = master.children(recursive=True)
    master.kill()  # the master's launcher (and its rendezvous store) vanishes
    nodes[1].wait(timeout=60)
    assert nodes[1].returncode != 0
    assert "stopped answering" in node_logs(tmp_path) or "exited with" in node_logs(tmp_path)
    # Its workers learn from the kernel that their launcher died, and stop.
    _, alive = psutil.wait_procs(orphans, timeout=60)
    assert not alive, f"workers outlived their launcher: {alive}"


def test_an_unwritable_run_folder_fails_fast_in_one_line_before_any_worker_starts(tmp_path):
    share = tmp_path / "share"  # the NFS export, not writable by the task's user
    share.mkdir()
    output_dir = share / "runs" / "dev"
    marker = tmp_path / "worker-started"
    worker = [sys.executable, "-c", f"open({str(marker)!r}, 'w')", "--output-dir", str(output_dir)]
    env = {**os.environ, **batch_env(0, free_port(), free_port())}
    env["AZ_BATCH_HOST_LIST"] = "127.0.0.1"
    launch = [sys.executable, "-m", "trainer.launch", "--workers-per-node", "1"]
    launch += ["--run-dir", str(output_dir), "--", *worker]
    with read_only(share):
        started = time.monotonic()
        result = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"error: output_dir={output_dir}: cannot create or write it as uid" in result.stderr
    assert "writable for the task's user" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists() and elapsed < 30


def _torch_command(output_dir, engine, *extra):
    """The trainer on ``engine``, run through ``torch_worker.py`` (which records each worker)."""
    return [
        sys.executable,
        TORCH_WORKER,
        *trainer_command(output_dir, "--backend", engine, *extra)[3:],
    ]


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_launchers_start_one_torch_group_across_the_nodes_and_both_exit_0(tmp_path, engine):
    out = tmp_path / "run"
    record = {"WORKER_RECORD": str(tmp_path)}
    port = free_port(consecutive=2)  # the launchers' own store; torch's is the next port
    nodes = start_nodes(
        tmp_path,
        _torch_command(out, engine, "--max-steps", "2", "--log-every", "1"),
        "--defer-exit-code",
        "--port",
        str(port),
        run_dir=out,
        backend=engine,
        node_env=(record, record),
    )
    for node in nodes:
        node.wait(timeout=120)
    logs = node_logs(tmp_path)
    # --defer-exit-code: a launcher exits 0 once it recorded the outcome; its log says which.
    assert [node.returncode for node in nodes] == [0, 0], logs
    for host in ("127.0.0.1", "127.0.0.2"):
        assert f"[launch {host}] done: node {host}: every worker finished (exit 0)" in logs, logs
    workers = [json.loads((tmp_path / f"worker-{rank}.json").read_text()) for rank in (0, 1)]
    # torch.distributed's own view: one group of two, rank 0 on the master node.
    assert [(w["rank"], w["size"], w["local_rank"]) for w in workers] == [(0, 2, 0), (1, 2, 0)]
    envs = [w["env"] for w in workers]
    assert [(e["RANK"], e["GROUP_RANK"], e["NODE_RANK"]) for e in envs] == [("0",) * 3, ("1",) * 3]
    assert {(e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs} == {
        ("2", "0", "1")
    }
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", str(port + 1))}
    assert {e["GLOO_SOCKET_IFNAME"] for e in envs} == {"lo"}
    assert all(e["HOROVOD_RANK"] is None for e in envs)  # no Horovod variables
    for index, host in enumerate(("127.0.0.1", "127.0.0.2")):
        started = f"[launch {host}] node {index + 1}/2: starting 1 worker(s) (attempt "
        (line,) = [line for line in logs.splitlines() if line.startswith(started)]
        assert line.endswith(f", {engine} on 127.0.0.1:{port + 1}")
    assert "done: step 2 (started at 0, stopped by max_steps), 2 worker(s)" in logs
    assert [r["step"] for r in read_metrics(out) if r.get("kind") == "train"] == [1, 2]
    assert "Traceback" not in logs


def test_a_dead_ddp_worker_on_one_node_ends_both_nodes_non_zero(tmp_path):
    out = tmp_path / "run"
    record = {"WORKER_RECORD": str(tmp_path)}
    command = _torch_command(out, "ddp", "--epochs", "200", "--log-every", "1")
    nodes = start_nodes(tmp_path, command, run_dir=out, backend="ddp", node_env=(record, record))
    wait_while_running(nodes, lambda: bool(read_metrics(out)), tmp_path)  # the group trains
    psutil.Process(nodes[1].pid).children()[0].kill()
    for node in nodes:
        node.wait(timeout=60)
    logs = node_logs(tmp_path)
    assert all(node.returncode != 0 for node in nodes), logs
    assert "[launch 127.0.0.2] node 127.0.0.2 worker 0 exited with -9" in logs
    # Node 1 stops through the launchers' store, or because its worker saw the peer go.
    assert (
        "[launch 127.0.0.1] node 127.0.0.2 worker 0 exited with -9: stopping" in logs
        or "[launch 127.0.0.1] node 127.0.0.1 worker 0 exited with" in logs
    ), logs
