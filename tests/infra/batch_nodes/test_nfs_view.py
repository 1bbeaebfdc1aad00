"""The emulator's incoherent NFS views (``tests.batch_emulator.nfs_view``), on a fake clock: what
one node writes is on the server at once and reaches another node only after that node's delay; and
the launcher's rendezvous and report through such views."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import pytest

from tests.batch_emulator.nfs_view import NfsViews
from tests.support.ports import free_port
from trainer.launch.batch_env import Node
from trainer.launch.records import KEEP_OUT_HINT, Outcome, RunRecords
from trainer.launch.rendezvous import new_token, start_gloo_rendezvous
from trainer.launch.store import join_store

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes

BOUND = 10.0


@pytest.fixture
def views(tmp_path) -> NfsViews:
    truth = tmp_path / "export"
    (truth / "runs").mkdir(parents=True)
    (truth / "runs" / "old.txt").write_text("old")
    views = NfsViews(truth, tmp_path / "views", 2, seed=7, bound=BOUND)
    for view in views.views:
        view.mirror()
    return views


def _when_seen(views: NfsViews, index: int, rel: str, content: str) -> float:
    """The fake time at which node ``index`` first reads ``content`` at ``rel``."""
    for now in itertools.count(0.0, 0.25):
        views.sync(now)
        path = views.path(index) / rel
        if path.exists() and path.read_text() == content:
            return now
        assert now <= BOUND + 1, f"{rel} never reached node {index}"
    raise AssertionError


def test_a_new_file_is_on_the_server_at_once_and_reaches_another_node_late(views):
    (views.path(0) / "runs" / "token").write_text("a")
    views.sync(0.0)
    assert (views.truth / "runs" / "token").read_text() == "a"
    assert not (views.path(1) / "runs" / "token").exists()  # a negative lookup, still trusted
    delay = views.views[1].pending["runs/token"].due
    assert 0 < delay <= BOUND
    assert _when_seen(views, 1, "runs/token", "a") >= delay


def test_a_replaced_file_serves_its_old_content_while_one_written_in_place_is_shared(views):
    """Replaced (a rename over the name): the old file until the delay passed. Written in
    place: close-to-open consistency (nfs(5)) gives every node the new bytes."""
    (views.path(0) / "runs" / "log").write_text("line 1\n")
    _when_seen(views, 1, "runs/log", "line 1\n")
    with open(views.path(0) / "runs" / "log", "a") as log:
        log.write("line 2\n")
    assert (views.path(1) / "runs" / "log").read_text() == "line 1\nline 2\n"
    new = views.path(0) / "runs" / ".old.txt.partial"
    new.write_text("new")
    new.replace(views.path(0) / "runs" / "old.txt")
    views.sync(100.0)
    assert (views.truth / "runs" / "old.txt").read_text() == "new"
    assert (views.path(1) / "runs" / "old.txt").read_text() == "old"
    due = views.views[1].pending["runs/old.txt"].due
    assert _when_seen_from(views, 100.0, 1, "runs/old.txt", "new") >= due


def _when_seen_from(views: NfsViews, start: float, index: int, rel: str, content: str) -> float:
    for now in itertools.count(start, 0.25):
        views.sync(now)
        if (views.path(index) / rel).read_text() == content:
            return now
        assert now <= start + BOUND + 1
    raise AssertionError


def test_a_removal_and_a_new_folder_reach_other_nodes_late_and_a_node_sees_its_own_at_once(
    views,
):
    (views.path(0) / "runs" / "old.txt").unlink()
    (views.path(0) / "runs" / "attempt").mkdir()
    (views.path(0) / "runs" / "attempt" / "outcome").write_text("{}")
    views.sync(0.0)
    assert not (views.truth / "runs" / "old.txt").exists()
    assert (views.truth / "runs" / "attempt" / "outcome").read_text() == "{}"
    assert (views.path(1) / "runs" / "old.txt").exists()
    assert not (views.path(1) / "runs" / "attempt").exists()
    for now in itertools.count(0.0, 0.25):
        views.sync(now)
        if (views.path(1) / "runs" / "attempt" / "outcome").exists():
            break
        assert now <= 2 * BOUND
    # A folder a node makes where the server has one already is the server's (EEXIST).
    (views.truth / "runs" / "mine").mkdir(mode=0o700)
    (views.path(1) / "runs" / "mine").mkdir(mode=0o777)
    views.sync(now)
    assert (views.path(1) / "runs" / "mine").stat().st_mode & 0o777 == 0o700


def test_a_folder_the_server_lost_is_made_again_by_a_node_that_writes_into_it(views):
    """The server's runs/ckpt is removed (a share wiped) while node 0 still caches it: what the
    node writes there after its mkdir reaches the server in the folder made again, not nowhere."""
    (views.path(0) / "runs" / "ckpt").mkdir()
    (views.path(0) / "runs" / "ckpt" / "step-1").write_text("1")
    views.sync(0.0)
    (views.truth / "runs" / "ckpt" / "step-1").unlink()
    (views.truth / "runs" / "ckpt").rmdir()
    (views.path(0) / "runs" / "ckpt").mkdir(exist_ok=True)  # cached: no error on the node
    (views.path(0) / "runs" / "ckpt" / "step-2").write_text("2")
    views.sync(0.5)
    assert (views.truth / "runs" / "ckpt" / "step-2").read_text() == "2"
    # The lost file goes from the node's view once its delay is over; the new one stays.
    for now in itertools.count(0.5, 0.25):
        views.sync(now)
        if not (views.path(0) / "runs" / "ckpt" / "step-1").exists():
            break
        assert now <= 2 * BOUND
    assert (views.path(0) / "runs" / "ckpt" / "step-2").read_text() == "2"
    assert (views.truth / "runs" / "ckpt").is_dir()


def test_a_seed_replays_the_same_delays(tmp_path):
    def delays(seed: int, folder: str) -> list[float]:
        truth = tmp_path / folder
        truth.mkdir()
        views = NfsViews(truth, tmp_path / f"{folder}-views", 2, seed=seed, bound=BOUND)
        for view in views.views:
            view.mirror()
        for name in ("a", "b", "c"):
            (views.path(0) / name).write_text(name)
        views.sync(0.0)
        return [views.views[1].pending[name].due for name in ("a", "b", "c")]

    assert delays(3, "one") == delays(3, "two") != delays(4, "three")


# --- the launcher's files through the views ---------------------------------------------------
class FakeClock:
    """Syncs the views each time the launcher waits, one quarter second later each time."""

    def __init__(self, views: NfsViews, start: float = 0.0) -> None:
        self.views, self.now = views, start

    def tick(self, _seconds: float = 0) -> None:
        self.now += 0.25
        self.views.sync(self.now)


def test_a_node_reading_an_earlier_launchs_token_through_its_view_joins_this_launch(views):
    """A retry's master replaces the token in place of the earlier launch's: the other node
    reads the old token until its view catches up, and keeps asking (the old one is refused)."""
    port, token, lines = free_port(), new_token(), []
    folder = Path("runs")
    master = RunRecords(views.path(0) / folder)
    master.publish_token(new_token())  # the earlier launch's
    clock = FakeClock(views)
    _when_seen(views, 1, "runs/logs/rendezvous.token", master.read_token() or "")
    clock.now = 50.0
    stop = start_gloo_rendezvous(port, ["127.0.0.1"], 1, token, lines.append)
    try:
        master.publish_token(token)
        other = RunRecords(views.path(1) / folder)
        node = Node(["127.0.0.1", "127.0.0.2"], 1, "127.0.0.1", port, False, "lo")
        read: list[str | None] = []

        def token_of() -> str | None:
            clock.tick()
            read.append(other.read_token())
            return read[-1]

        store = join_store(node, token_of, seconds=30, sleep=0)
    finally:
        stop()
    assert store.token == token
    assert read[0] != token and lines, "the view served the replaced token at first"


def _outcome(records: RunRecords, attempt: str, host: str, code: int) -> None:
    records.log_path(attempt, host).parent.mkdir(parents=True, exist_ok=True)
    records.log_path(attempt, host).write_text(f"log of {host}\n")
    records.finish(attempt, host, Outcome(code, f"{host} ended with {code}"))


def test_the_report_finds_the_outcome_another_node_just_wrote(views):
    """Batch runs the report on the primary once every node's coordination command returned:
    the other node's outcome is on the server, not yet in the primary's view."""
    hosts = ["10.0.0.4", "10.0.0.5"]
    env = {"AZ_BATCH_HOST_LIST": ",".join(hosts), "AZ_BATCH_JOB_ID": "job-1"}
    master = RunRecords(views.path(0) / "runs")
    attempt = master.new_attempt()
    master.start(attempt, hosts, env)
    _outcome(master, attempt, hosts[0], 0)
    clock = FakeClock(views)
    _when_seen(
        views,
        1,
        f"runs/logs/{attempt}/outcome-{hosts[0]}.json",
        (views.path(0) / "runs" / "logs" / attempt / f"outcome-{hosts[0]}.json").read_text(),
    )
    other = RunRecords(views.path(1) / "runs")
    _outcome(other, attempt, hosts[1], 3)
    clock.now = 100.0
    views.sync(clock.now)
    assert (
        json.loads(
            (views.truth / "runs" / "logs" / attempt / f"outcome-{hosts[1]}.json").read_text()
        )["code"]
        == 3
    )
    out = io.StringIO()
    assert master.report(env, out, sleep=clock.tick) == 3, out.getvalue()
    assert "log of 10.0.0.5" in out.getvalue()
    assert (
        out.getvalue().splitlines()[-1].endswith(f"10.0.0.5 ended with 3 (exit 3); {KEEP_OUT_HINT}")
    )
