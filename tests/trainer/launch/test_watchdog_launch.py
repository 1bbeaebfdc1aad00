"""The launcher's line when a worker's step watchdog fired (trainer.launch.workers.supervise):
real worker processes that exit as a fired watchdog does (86) or stay blocked."""

from __future__ import annotations

import sys

import pytest

from trainer.common.exit_codes import WATCHDOG_EXIT
from trainer.launch import workers as workers_module
from trainer.launch.batch_env import Node
from trainer.launch.records import RunLog
from trainer.launch.workers import Workers, supervise

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

# A worker whose watchdog fired (its one line, then exit 86), or one wedged where no watchdog
# runs (it never exits by itself).
WORKER = (
    "import os, sys, time\n"
    "if os.environ['MODE'] == 'fired':\n"
    "    print('error: watchdog: rank 0 on host n0 is stuck', file=sys.stderr, flush=True)\n"
    f"    sys.exit({WATCHDOG_EXIT})\n"
    "time.sleep(600)\n"
)
NODE = Node(
    hosts=["10.0.0.4", "10.0.0.5"],
    index=1,
    master_ip="10.0.0.4",
    port=0,
    is_master=False,
    iface="lo",
)


class Store:
    def __init__(self) -> None:
        self.keys: dict[str, str] = {}

    def put(self, key: str, value: str) -> None:
        self.keys[key] = value

    def get(self, key: str) -> str | None:
        return self.keys.get(key)


def supervised(modes: list[str], monkeypatch, capsys):
    monkeypatch.setattr(workers_module, "WATCHDOG_GATHER_SECONDS", 2)
    envs = [{"MODE": mode, "PATH": "/usr/bin:/bin"} for mode in modes]
    workers = Workers([sys.executable, "-c", WORKER], envs, RunLog("10.0.0.5", keep_early=False))
    store = Store()
    outcome = supervise(NODE, workers, store, RunLog("10.0.0.5", keep_early=False))
    workers.join_output()
    captured = capsys.readouterr()  # the workers' output reaches the launcher's stdout
    return outcome, store, captured.out + captured.err


def test_every_worker_fired_names_them_all_and_keeps_the_watchdogs_exit(monkeypatch, capsys):
    outcome, store, err = supervised(["fired", "fired"], monkeypatch, capsys)
    assert outcome.code == WATCHDOG_EXIT
    assert outcome.reason == (
        "node 10.0.0.5: the step watchdog fired on worker 0, 1 (no step completed within "
        "--step-timeout-minutes; stacks and collectives in the run's watchdog/ folder); "
        "did not fire: none"
    )
    assert store.keys["failed"] == outcome.reason  # what the other nodes stop with
    assert f"[launch 10.0.0.5] {outcome.reason}: stopping the job on every node" in err


def test_a_worker_that_did_not_fire_is_named_as_the_suspect_and_stopped(monkeypatch, capsys):
    outcome, _, err = supervised(["fired", "wedged"], monkeypatch, capsys)
    assert outcome.code == WATCHDOG_EXIT
    assert outcome.reason.endswith(
        "fired on worker 0 (no step completed within "
        "--step-timeout-minutes; stacks and collectives in the run's watchdog/ folder); "
        "did not fire: 1 (still running)"
    )
    assert "error: watchdog: rank 0 on host n0 is stuck" in err
