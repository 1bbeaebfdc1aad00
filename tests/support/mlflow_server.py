"""A real MLflow tracking server on 127.0.0.1 for the tests: ``mlflow server`` over a SQLite store
(the file store needs an opt-in in current MLflow), serving its artifacts from a folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.ports import free_port

START_SECONDS = 120  # its first start imports its web stack and creates the store's tables


@contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """The server's URI while the block runs; stopped (and waited for) after it."""
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    log = open(folder / "server.log", "wb")  # noqa: SIM115 - closed below
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
        "--artifacts-destination", str(folder / "artifacts"),
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_until_healthy(uri, server, folder / "server.log")
        yield uri
    finally:
        _stop(server)
        log.close()


def _stop(server: subprocess.Popen[bytes]) -> None:
    """The server and its workers (their own session): SIGTERM, then SIGKILL after 20 s."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(20)


def _wait_until_healthy(uri: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(
                f"mlflow server exited {server.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"mlflow server not healthy in {START_SECONDS} s: {log.read_text()[-2000:]}")
