"""A real MLflow tracking server for the tests: ``mlflow server`` over a SQLite store (the file
store needs an opt-in in current MLflow), serving its artifacts from a folder; on 127.0.0.1, or
on an address of a network namespace (``prefix``: the command that enters it), as a server in a
stack's network is for its emulated nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.ports import free_port

START_SECONDS = 120  # its first start imports its web stack and creates the store's tables


@contextmanager
def mlflow_server(
    folder: Path, host: str = "127.0.0.1", port: int = 0, prefix: Sequence[str] = ()
) -> Iterator[str]:
    """The server's URI while the block runs; stopped (and waited for) after it. Its store
    stays in ``folder`` (``store_uri``), for reading once it stopped."""
    port = port or free_port()
    folder.mkdir(parents=True, exist_ok=True)
    log = open(folder / "server.log", "wb")  # noqa: SIM115 - closed below
    command = [
        *prefix, sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port),
        "--workers", "1", "--backend-store-uri", store_uri(folder),
        "--artifacts-destination", str(folder / "artifacts"),
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://{host}:{port}"
    try:
        _wait_until_healthy(uri, server, folder / "server.log", prefix)
        yield uri
    finally:
        _stop(server)
        log.close()


def store_uri(folder: Path) -> str:
    """The server's SQLite store: what a client reads directly once the server stopped."""
    return f"sqlite:///{folder / 'mlflow.db'}"


def _stop(server: subprocess.Popen[bytes]) -> None:
    """The server and its workers (their own session): SIGTERM, then SIGKILL after 20 s."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(20)


def _healthy(uri: str, prefix: Sequence[str]) -> bool:
    """Whether the server answers its health check, asked from where it listens."""
    if prefix:
        ask = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)"
        command = [*prefix, sys.executable, "-c", ask, f"{uri}/health"]
        return subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait_until_healthy(
    uri: str, server: subprocess.Popen[bytes], log: Path, prefix: Sequence[str]
) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(
                f"mlflow server exited {server.returncode}: {log.read_text()[-2000:]}"
            )
        if _healthy(uri, prefix):
            return
        time.sleep(0.5)
    raise RuntimeError(f"mlflow server not healthy in {START_SECONDS} s: {log.read_text()[-2000:]}")
