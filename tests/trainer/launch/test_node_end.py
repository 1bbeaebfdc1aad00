"""How a node that is not the master ends once its workers all exited 0
(trainer.launch.workers.supervise): real worker processes, a store that answers or is gone."""

from __future__ import annotations

import sys

import pytest

from tests.trainer.launch.test_watchdog_launch import NODE
from trainer.launch.records import RunLog
from trainer.launch.workers import Workers, supervise

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


class Store:
    """The master's store; ``gone``: its launcher died (connections are refused)."""

    def __init__(self, gone: bool) -> None:
        self.gone, self.keys = gone, dict[str, str]()

    def put(self, key: str, value: str) -> None:
        if self.gone:
            raise ConnectionRefusedError(111, "Connection refused")
        self.keys[key] = value

    def get(self, key: str) -> str | None:
        return self.keys.get(key)


def ended(store: Store, capsys):
    log = RunLog("10.0.0.5", keep_early=False)
    workers = Workers([sys.executable, "-c", "pass"], [{"PATH": "/usr/bin:/bin"}], log)
    outcome = supervise(NODE, workers, store, log)
    workers.join_output()
    captured = capsys.readouterr()
    return outcome, captured.out + captured.err


def test_workers_that_finished_are_reported_to_the_master_and_the_node_exits_0(capsys):
    store = Store(gone=False)
    outcome, _ = ended(store, capsys)
    assert (outcome.code, outcome.reason) == (0, "node 10.0.0.5: every worker finished")
    assert store.keys == {"done-1": "0"}


def test_workers_that_stopped_after_the_master_vanished_do_not_make_a_success(capsys):
    """A killed master launcher's workers stop at the next step (watch.signals.die_with_parent)
    and the stop vote stops this node's workers too, with exit 0; the master keeps its store
    until every node reported, so a store gone at this report means the master died."""
    outcome, said = ended(Store(gone=True), capsys)
    assert outcome.code == 1
    assert outcome.reason == (
        "node 10.0.0.5: every worker stopped, but the master node 10.0.0.4 stopped answering "
        "before this node reported"
    )
    assert f"[launch 10.0.0.5] {outcome.reason}: the run did not finish" in said
