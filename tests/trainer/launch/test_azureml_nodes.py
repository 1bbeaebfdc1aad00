"""The launcher on two simulated AzureML nodes (127.0.0.1 and 127.0.0.2): each launcher is the
one process per node of a command job's PyTorch distribution, started with AzureML's variables
and the job's token (tests.trainer.launch.launch_nodes.azureml_env), with no run folder and no
Batch variable. The same workers start as on Batch: Horovod's and torch.distributed's train
across the two; a dead worker ends both nodes; a launch with another job's token never joins."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.support.launchers import read_metrics
from tests.trainer.launch.launch_nodes import free_port, start_nodes, trainer_command

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

TOKEN = "azureml-job-token"


def _logs(tmp_path):
    return "\n".join((tmp_path / f"node{i}.log").read_text() for i in (0, 1))


@pytest.mark.parametrize("engine", ["horovod", "ddp"])
def test_two_azureml_nodes_train_one_run_and_both_exit_0(tmp_path, engine):
    out = tmp_path / "run"
    port = free_port(consecutive=2)  # AzureML's MASTER_PORT: the launchers' store, torch's next
    nodes = start_nodes(
        tmp_path,
        trainer_command(out, "--backend", engine, "--max-steps", "3", "--log-every", "1"),
        "--port",
        str(port),
        backend=engine,
        azureml_token=TOKEN,
    )
    for node in nodes:
        node.wait(timeout=180)
    logs = _logs(tmp_path)
    assert [node.returncode for node in nodes] == [0, 0], logs
    assert "[launch 127.0.0.1] node 1/2: starting 1 worker(s)" in logs, logs
    assert "[launch node-1] node 2/2: starting 1 worker(s)" in logs, logs
    assert "[launch node-1] done: node node-1: every worker finished (exit 0)" in logs, logs
    assert "done: step 3 (started at 0, stopped by max_steps), 2 worker(s)" in logs, logs
    assert [r["step"] for r in read_metrics(out) if r.get("kind") == "train"] == [1, 2, 3]
    assert "Traceback" not in logs


def test_a_dead_worker_on_an_azureml_node_ends_both_nodes_non_zero(tmp_path):
    out = tmp_path / "run"
    nodes = start_nodes(
        tmp_path,
        trainer_command(out, "--epochs", "200", "--log-every", "1"),
        azureml_token=TOKEN,
    )
    deadline = time.monotonic() + 120
    while not read_metrics(out):  # training has started on both nodes
        assert time.monotonic() < deadline, _logs(tmp_path)
        assert all(node.poll() is None for node in nodes), _logs(tmp_path)
        time.sleep(0.2)
    psutil.Process(nodes[1].pid).children()[0].kill()
    for node in nodes:
        node.wait(timeout=60)
    logs = _logs(tmp_path)
    assert all(node.returncode != 0 for node in nodes), logs
    assert "[launch node-1] node node-1 (127.0.0.2) worker 0 exited with -9" in logs, logs
    assert "Traceback" not in logs


def test_a_launch_with_another_jobs_token_is_refused_by_the_master(tmp_path):
    """The store admits this job's token only: a node of another job (a stale one on the same
    network) is refused at every request, and the master says so without the tokens."""
    out = tmp_path / "run"
    command = trainer_command(out, "--max-steps", "2")
    port = free_port(consecutive=2)
    nodes = start_nodes(
        tmp_path, command, "--port", str(port), azureml_token=TOKEN,
        node_env=({}, {"DT_RENDEZVOUS_TOKEN": "another-job"}),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while "no valid job token" not in (tmp_path / "node0.log").read_text():
        assert time.monotonic() < deadline, _logs(tmp_path)
        time.sleep(0.2)
    for node in nodes:
        node.terminate()
        node.wait(timeout=60)
    logs = _logs(tmp_path)
    assert "[launch 127.0.0.1] refused GET .../launcher/probe from " in logs, logs
    assert "another-job" not in logs and TOKEN not in logs  # tokens stay out of logs
    assert not read_metrics(out)  # no worker trained
