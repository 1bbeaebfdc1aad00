"""The emulated storage account: Azurite over HTTPS on the VNet, as the nodes reach it
(``Storage``), and the tests' own Blob operations with the account key, run by one long-lived
agent on the storage side of the VNet (``blob``)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.batch_emulator import AGENT, REPO
from tests.batch_emulator.vnet import VNet

# Azurite's published development account (it opens only the local emulator).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
# The most one Blob operation of the tests may take (the largest uploads a few MB).
BLOB_CALL_SECONDS = 120


@dataclass(frozen=True)
class Storage:
    """The storage account as the nodes reach it (Azurite over HTTPS with token auth)."""

    blob_endpoint: str  # https://<ip>/<account>/ , what infra calls the blob endpoint
    ca_file: Path
    account: str
    key: str

    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=https;AccountName={self.account};AccountKey={self.key};"
            f"BlobEndpoint={self.blob_endpoint.rstrip('/')};"
        )


class _BlobAgent:
    """The agent's ``blob-serve`` on the storage side of the VNet, kept up for the session."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        """``process``: text pipes on its stdin and stdout."""
        self.lock = threading.Lock()
        self.process = process

    @classmethod
    def start(cls, vnet: VNet, account: Storage) -> _BlobAgent:
        return cls(subprocess.Popen(
            [*vnet.exec_prefix(vnet.switch if vnet.isolated else None), sys.executable,
             str(AGENT), "blob-serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "REQUESTS_CA_BUNDLE": str(account.ca_file), "PYTHONPATH": str(REPO)},
        ))  # fmt: skip

    def ask(self, request: dict) -> dict:
        assert self.process.stdin and self.process.stdout
        with self.lock:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            # Each request is answered by one whole line, so nothing is left buffered between
            # calls and the pipe itself says whether the answer came.
            if not select.select([self.process.stdout], [], [], BLOB_CALL_SECONDS)[0]:
                self.process.kill()
                raise RuntimeError(f"the blob agent gave no answer in {BLOB_CALL_SECONDS} s")
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the blob agent exited ({self.process.poll()})")
        return json.loads(line)

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_blob_agents: dict[str, _BlobAgent] = {}


def blob(vnet: VNet, account: Storage, action: str, **arguments: Any) -> Any:
    """A Blob operation from the storage side of the VNet, with the account key (what a user
    or CI does with the portal or the CLI)."""
    agent = _blob_agents.get(account.blob_endpoint)
    if agent is None or agent.process.poll() is not None:  # one killed for not answering: anew
        agent = _blob_agents[account.blob_endpoint] = _BlobAgent.start(vnet, account)
    request = {"connection_string": account.connection_string(), "action": action, **arguments}
    answer = agent.ask(request)
    if "error" in answer:
        raise RuntimeError(f"blob {action}: {answer['error']}")
    return answer["result"]


def close_blob_agent(account: Storage) -> None:
    """The session's blob agent for ``account`` ends (the account's Azurite is going)."""
    agent = _blob_agents.pop(account.blob_endpoint, None)
    if agent:
        agent.close()
