"""Two simulated Batch nodes on 127.0.0.1 and 127.0.0.2: two ``trainer.launch`` processes, each
with its own multi-instance task environment, as Batch would start them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

HOSTS = ("127.0.0.1", "127.0.0.2")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_nodes(logs: Path, worker_command: list[str], *launch_args: str) -> list[subprocess.Popen]:
    port = free_port()
    processes = []
    for index, host in enumerate(HOSTS):
        env = {
            **os.environ,
            "AZ_BATCH_HOST_LIST": ",".join(HOSTS),
            "AZ_BATCH_MASTER_NODE": f"{HOSTS[0]}:{port}",
            "AZ_BATCH_IS_CURRENT_NODE_MASTER": "true" if index == 0 else "false",
        }
        log = open(logs / f"node{index}.log", "w")  # noqa: SIM115  # closed with the process
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trainer.launch",
                    "--workers-per-node",
                    "1",
                    "--node-ip",
                    host,
                    *launch_args,
                    "--",
                    *worker_command,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return processes


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
