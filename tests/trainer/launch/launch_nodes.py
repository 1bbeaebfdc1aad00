"""Two simulated nodes on 127.0.0.1 and 127.0.0.2: two ``trainer.launch`` processes, each with
its own multi-instance task environment, as Batch would start them, or with the variables an
AzureML job's PyTorch distribution gives its one process per node."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.ports import free_port

HOSTS = ("127.0.0.1", "127.0.0.2")
JOB_ID = "sim-job"


@contextmanager
def held_port() -> Iterator[int]:
    """A port something else listens on, as Batch does on the one in AZ_BATCH_MASTER_NODE."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield sock.getsockname()[1]


def batch_env(
    index: int, batch_port: int, rendezvous_port: int, hosts: tuple[str, ...] = HOSTS
) -> dict[str, str]:
    """Node ``index``'s multi-instance task variables (MASTER_PORT: a free port, so parallel
    test runs on one machine do not share 6105)."""
    return {
        "AZ_BATCH_HOST_LIST": ",".join(hosts),
        "AZ_BATCH_MASTER_NODE": f"{hosts[0]}:{batch_port}",
        "AZ_BATCH_IS_CURRENT_NODE_MASTER": "true" if index == 0 else "false",
        "AZ_BATCH_JOB_ID": JOB_ID,
        "MASTER_PORT": str(rendezvous_port),
    }


def azureml_env(index: int, rendezvous_port: int, hosts: tuple[str, ...] = HOSTS) -> dict[str, str]:
    """Node ``index``'s variables in an AzureML command job whose PyTorch distribution starts one
    process per node (how-to-train-distributed-gpu.md, read 2026-11-29)."""
    return {
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(rendezvous_port),
        "WORLD_SIZE": str(len(hosts)),
        "NODE_RANK": str(index),
        "RANK": str(index),
        "LOCAL_RANK": "0",
    }


def start_nodes(
    logs: Path,
    worker_command: list[str],
    *launch_args: str,
    run_dir: Path | None = None,
    backend: str = "horovod",
    batch_port: int | None = None,
    node_env: tuple[dict[str, str], ...] = ({}, {}),
    hosts: tuple[str, ...] = HOSTS,
    prefix: Callable[[int], list[str]] = lambda index: [],
    azureml: bool = False,
    node_args: tuple[list[str], ...] = (),
) -> list[subprocess.Popen]:
    """``run_dir`` and ``backend``: the launcher's --run-dir and --backend, as the job gives
    them (the worker command's own are not read); ``batch_port``: the port in
    AZ_BATCH_MASTER_NODE (default: some free port); ``node_env``: more variables for each
    node; ``hosts``: the nodes' addresses; ``prefix(index)``: what runs node ``index``'s
    launcher (``ip netns exec NS``: a node in a network namespace of its own);
    ``azureml``: the nodes are an AzureML job's (``azureml_env``), not Batch's; ``node_args``:
    more launcher flags for each node (none when empty)."""
    given = ["--backend", backend, *(["--run-dir", str(run_dir)] if run_dir else [])]
    if azureml:
        given += ["--platform", "azureml"]
    batch_port = batch_port or free_port()
    port = free_port(consecutive=2)  # torch.distributed's store takes the next one
    processes = []
    for index, host in enumerate(hosts):
        variables = (
            azureml_env(index, port, hosts)
            if azureml
            else batch_env(index, batch_port, port, hosts)
        )
        env = {**os.environ, **variables, **node_env[index]}
        log = open(logs / f"node{index}.log", "w")  # noqa: SIM115  # closed with the process
        processes.append(
            subprocess.Popen(
                [
                    *prefix(index),
                    sys.executable,
                    "-m",
                    "trainer.launch",
                    "--workers-per-node",
                    "1",
                    "--node-ip",
                    host,
                    *given,
                    *launch_args,
                    *(node_args[index] if node_args else []),
                    "--",
                    *worker_command,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return processes


def report(
    run_dir: Path, worker_command: list[str] | None = None, hosts: tuple[str, ...] = HOSTS
) -> subprocess.CompletedProcess[str]:
    """The application command on the primary: ``trainer.launch --report``."""
    env = {**os.environ, **batch_env(0, free_port(), free_port(), hosts)}
    worker = worker_command or trainer_command(run_dir)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.launch",
            "--run-dir",
            str(run_dir),
            "--report",
            "--",
            *worker,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def trainer_command(output_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainer",
        "--model",
        "tiny",
        "--num-classes",
        "5",
        "--image-size",
        "16",
        "--batch-size",
        "8",
        "--synthetic-size",
        "64",
        "--synthetic-pool",
        "32",
        "--warmup-epochs",
        "1",
        "--loader-workers",
        "0",
        "--output-dir",
        str(output_dir),
        *extra,
    ]


def node_logs(logs: Path) -> str:
    """Both simulated nodes' output, as start_nodes wrote it to ``logs``."""
    return "\n".join((logs / f"node{i}.log").read_text() for i in range(len(HOSTS)))


def wait_while_running(
    nodes: list[subprocess.Popen], until: Callable[[], bool], logs: Path, seconds: float = 120
) -> None:
    """Wait until ``until()`` holds, failing with the nodes' output if a node ends first or
    ``seconds`` pass (a bound on a wait that should end, never a measure)."""
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, node_logs(logs)
        assert all(node.poll() is None for node in nodes), node_logs(logs)
        time.sleep(0.2)
