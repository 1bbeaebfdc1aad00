"""The launchers' own keys in the master's rendezvous server (``Store``, scope ``launcher``, behind
the job's token): how the nodes meet (``join_store``), name the attempt, report failures and
completion; ``trainer.launch.eviction`` exchanges the VM names for Scheduled Events through it.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

from trainer.launch.batch_env import LaunchError, Node
from trainer.launch.rendezvous import job_segment
from trainer.launch.stop import STOP

POLL_SECONDS = 0.5
MASTER_WAIT_SECONDS = 300
# How long the master keeps the rendezvous up for the other nodes to report once its own
# workers finished.
DONE_WAIT_SECONDS = 60


class Stopped(Exception):
    """A SIGTERM/SIGINT came while the launcher waited for the other nodes (``STOP``)."""


def _check_stop() -> None:
    if STOP.requested:
        raise Stopped(f"signal {STOP.signum}")


class Store:
    """The launchers' keys in the rendezvous server (scope ``launcher``), behind the job's
    token (``trainer.launch.rendezvous``)."""

    def __init__(self, master_ip: str, port: int, token: str) -> None:
        self.token = token
        self.base = f"http://{master_ip}:{port}/{job_segment(token, port)}/launcher"
        # What messages name: the token stays out of logs.
        self.address = f"http://{master_ip}:{port}"

    def put(self, key: str, value: str) -> None:
        request = urllib.request.Request(f"{self.base}/{key}", value.encode(), method="PUT")
        urllib.request.urlopen(request, timeout=5).close()

    def get(self, key: str) -> str | None:
        """The value, None when absent; raises OSError when the store is unreachable."""
        try:
            with urllib.request.urlopen(f"{self.base}/{key}", timeout=5) as response:
                return response.read().decode()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise

    def wait_for(self, key: str, seconds: float) -> str:
        """The value of ``key`` once some launcher put it."""
        deadline = time.monotonic() + seconds
        while (value := self.get(key)) is None:
            _check_stop()
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"the master did not publish {key!r} at {self.address} in {seconds:g} s: "
                    "check the master node's task output"
                )
            time.sleep(POLL_SECONDS)
        return value

    def answers(self) -> bool:
        """Whether the master's store is up and takes this token."""
        try:
            self.get("probe")
            return True
        except OSError:  # not up yet, or (an HTTPError 403) another launch's token
            return False


def join_store(
    node: Node, token_of: Callable[[], str | None], seconds: float, sleep: float = 1
) -> Store:
    """The master's store, once it answers to the token ``token_of`` returns (None: not
    published yet). Asked again on every try: a node may read an earlier launch's token before
    the master replaced it, which the master's store refuses."""
    deadline = time.monotonic() + seconds
    while True:
        _check_stop()
        token = token_of()
        if token is not None:
            store = Store(node.master_ip, node.port, token)
            if store.answers():
                return store
        if time.monotonic() > deadline:
            raise LaunchError(
                f"the master's rendezvous at http://{node.master_ip}:{node.port} did not "
                f"answer to this launch's token in {seconds:g} s: check the master node's "
                "task output"
            )
        time.sleep(sleep)


def wait_for_other_nodes(node: Node, store: Store) -> None:
    """The master keeps the rendezvous up until every node reported (or a minute passed)."""
    deadline = time.monotonic() + DONE_WAIT_SECONDS
    pending = set(range(len(node.hosts))) - {node.index}
    while pending and time.monotonic() < deadline:
        pending = {i for i in pending if store.get(f"done-{i}") is None and not store.get("failed")}
        time.sleep(POLL_SECONDS)
