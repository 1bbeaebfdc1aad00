"""The launcher on two simulated AzureML nodes (127.0.0.1 and 127.0.0.2): each launcher is the
one process per node of a command job's PyTorch distribution, started with AzureML's variables
(tests.trainer.launch.launch_nodes.azureml_env), with no run folder and no Batch variable; the
master hands its token to the other node in the job's Blob folder (Azurite, reached as the nodes'
managed identity). The same workers start as on Batch: Horovod's and torch.distributed's train
across the two; a dead worker ends both nodes; a node that reads another launch's token is
refused."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from tests.support.launchers import read_metrics
from tests.trainer.launch.launch_nodes import (
    azureml_env,
    free_port,
    node_logs,
    start_nodes,
    trainer_command,
    wait_while_running,
)

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

TOKEN_BLOB = "sim-job/rendezvous.token"


def _azureml(storage, container: str) -> dict:
    """start_nodes' arguments for an AzureML job whose Blob folder is ``container``/sim-job/."""
    url = storage.folder_url(container, "sim-job/")
    return {"azureml": True, "node_env": (storage.env(), storage.env())} | {
        "node_args": (["--token-url", url], ["--token-url", url])
    }


@pytest.mark.parametrize("engine", ["horovod", "ddp"])
def test_two_azureml_nodes_train_one_run_and_both_exit_0(tmp_path, engine, azurite_entra, logs):
    out = tmp_path / "run"
    port = free_port(consecutive=2)  # AzureML's MASTER_PORT: the launchers' store, torch's next
    nodes = start_nodes(
        tmp_path,
        trainer_command(out, "--backend", engine, "--max-steps", "3", "--log-every", "1"),
        "--port",
        str(port),
        backend=engine,
        **_azureml(azurite_entra, logs.container_name),
    )
    for node in nodes:
        node.wait(timeout=180)
    said = node_logs(tmp_path)
    assert [node.returncode for node in nodes] == [0, 0], said
    assert "[launch 127.0.0.1] node 1/2: starting 1 worker(s)" in said, said
    assert "[launch node-1] node 2/2: starting 1 worker(s)" in said, said
    assert "[launch node-1] done: node node-1: every worker finished (exit 0)" in said, said
    assert "done: step 3 (started at 0, stopped by max_steps), 2 worker(s)" in said, said
    assert [r["step"] for r in read_metrics(out) if r.get("kind") == "train"] == [1, 2, 3]
    assert "Traceback" not in said
    token = logs.download_blob(TOKEN_BLOB).readall().decode()
    assert len(token) >= 43 and token not in said  # 32 random bytes, kept out of the logs


def test_a_dead_worker_on_an_azureml_node_ends_both_nodes_non_zero(tmp_path, azurite_entra, logs):
    out = tmp_path / "run"
    nodes = start_nodes(
        tmp_path,
        trainer_command(out, "--epochs", "200", "--log-every", "1"),
        **_azureml(azurite_entra, logs.container_name),
    )
    wait_while_running(nodes, lambda: bool(read_metrics(out)), tmp_path)  # training started
    psutil.Process(nodes[1].pid).children()[0].kill()
    for node in nodes:
        node.wait(timeout=60)
    said = node_logs(tmp_path)
    assert all(node.returncode != 0 for node in nodes), said
    assert "[launch node-1] node node-1 (127.0.0.2) worker 0 exited with -9" in said, said
    assert "Traceback" not in said


def test_a_node_that_reads_another_launchs_token_is_refused_by_the_master(
    tmp_path, azurite_entra, logs
):
    """The other node reads its token from another folder, where an earlier launch left one:
    the master's store refuses it at every request, and says so without the tokens."""
    logs.upload_blob("old-job/rendezvous.token", b"an-earlier-launchs-token")
    out = tmp_path / "run"
    arguments = _azureml(azurite_entra, logs.container_name)
    stale = azurite_entra.folder_url(logs.container_name, "old-job/")
    arguments["node_args"] = (arguments["node_args"][0], ["--token-url", stale])
    port = free_port(consecutive=2)
    nodes = start_nodes(
        tmp_path, trainer_command(out, "--max-steps", "2"), "--port", str(port), **arguments
    )
    refused = lambda: "no valid job token" in (tmp_path / "node0.log").read_text()  # noqa: E731
    wait_while_running(nodes, refused, tmp_path, seconds=60)
    for node in nodes:
        node.terminate()
        node.wait(timeout=60)
    said = node_logs(tmp_path)
    assert "[launch 127.0.0.1] refused GET .../launcher/probe from " in said, said
    assert "an-earlier-launchs-token" not in said
    assert logs.download_blob(TOKEN_BLOB).readall().decode() not in said
    assert not read_metrics(out)  # no worker trained


def _launch(env: dict, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "trainer.launch", *flags, "--", sys.executable, "-c", ""]
    return subprocess.run(
        command, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_what_an_azureml_launch_lacks_is_one_line_before_anything_starts():
    master = azureml_env(0, free_port(consecutive=2))
    result = _launch(master, "--platform", "azureml", "--node-ip", "127.0.0.1")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "WORLD_SIZE=2 with no --token-url: an AzureML job's nodes share no folder" in (
        result.stderr
    )
    url = "https://127.0.0.1:1/devstoreaccount1/logs/sim-job/"
    result = _launch({}, "--token-url", url)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "--token-url is for --platform azureml" in result.stderr


def test_a_token_the_master_cannot_hand_on_ends_it_in_one_line_exit_1(azurite_entra):
    """The job's folder in a container that does not exist (a stack without its logs
    container): the master says where and why, and no worker starts."""
    url = azurite_entra.folder_url("no-such-container", "sim-job/")
    master = {**azureml_env(0, free_port(consecutive=2)), **azurite_entra.env()}
    flags = ("--platform", "azureml", "--node-ip", "127.0.0.1", "--token-url", url)
    result = _launch(master, *flags)
    assert result.returncode == 1, result.stderr
    line = f"cannot hand the rendezvous token to the other nodes at {url}rendezvous.token: "
    assert line in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "starting" not in result.stdout + result.stderr
