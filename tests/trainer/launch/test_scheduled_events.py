"""Scheduled Events against a fake Instance Metadata Service on 127.0.0.1
(tests/support/fake_imds.py), which answers the first request for events late, as Azure does, and
lists events that name other VMs of the placement group."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.fake_imds import VM, FakeImds, serving
from tests.support.fake_imds import event as _event
from trainer.launch.scheduled_events import Event, ScheduledEvents, Watcher

WAIT = 30  # seconds any expected change may take on a loaded machine; never a speed check


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    """A VM that asked for events recently: its service answers at once."""
    with serving() as server:
        server.enable()
        yield server


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


class Job:
    """The job's VM names as the launchers exchange them
    (``trainer.launch.scheduled_events.JobVms``)."""

    def __init__(self, *others: str) -> None:
        self.published: list[str] = []
        self.others = set(others)

    def publish(self, vm_name: str) -> None:
        self.published.append(vm_name)

    def names(self) -> set[str]:
        return {*self.published, *self.others}


def test_only_this_vms_interrupting_events_count(imds):
    imds.events = [
        _event("a", "Preempt", [VM]),
        _event("b", "Freeze", [VM]),  # a pause of seconds: nothing to save
        _event("c", "Reboot", ["another-node"]),  # same placement group, not this VM
        _event("d", "Redeploy", ["another-node", VM]),
    ]
    events = ScheduledEvents(imds.url).pending()
    assert [(e.event_id, e.event_type) for e in events] == [("a", "Preempt"), ("d", "Redeploy")]
    assert events[1].resources == ("another-node", VM)
    assert all(header == "true" for _, _, header in imds.requests)


def test_no_events_is_nothing_pending(imds):
    assert ScheduledEvents(imds.url).pending() == []


def test_approval_posts_the_start_requests(imds):
    client = ScheduledEvents(imds.url)
    client.approve([Event("a", "Preempt", ""), Event("d", "Terminate", "")])
    assert imds.approved == [{"StartRequests": [{"EventId": "a"}, {"EventId": "d"}]}]
    client.approve([])  # nothing to approve: no request
    assert len(imds.approved) == 1


def test_the_late_first_answer_is_waited_out():
    """Azure answers the first request for events up to two minutes late (the fake: a few
    seconds, more than the two seconds the client once waited before giving up for good)."""
    with serving() as imds:
        imds.events = [_event("a", "Preempt", [VM])]
        client = ScheduledEvents(imds.url)
        assert [e.event_id for e in client.pending()] == ["a"]
        assert imds.enabled.is_set()


def test_the_watcher_asks_again_after_a_timeout_and_then_notices():
    lines: list[str] = []
    with serving(first_call_delay=None) as imds:  # on only once the test says so
        client = ScheduledEvents(imds.url, timeout=0.2, first_timeout=0.2)
        watcher = Watcher(client, interval=0.01, say=lines.append).start()
        _until(lambda: imds.events_asked() >= 3, "three requests for events")
        assert not watcher.noticed and watcher._thread.is_alive()
        # Asking again after a timeout is shown; the answer now only has to come, however
        # slowly a busy machine runs the fake's thread (the client reads these on every call).
        client.timeout = client.first_timeout = 30
        imds.events = [_event("spot-1", "Preempt", [VM])]
        imds.enable()
        _until(lambda: watcher.noticed, "the notice")
    assert [e.event_id for e in watcher.events] == ["spot-1"]
    assert len(lines) == 1 and "still asking" in lines[0], lines  # said once


def test_off_azure_the_watcher_stops_and_says_so_once():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    lines: list[str] = []
    watcher = Watcher(ScheduledEvents(f"http://127.0.0.1:{port}"), interval=0.01, say=lines.append)
    watcher.start()._thread.join(WAIT)
    assert not watcher._thread.is_alive() and not watcher.noticed
    assert len(lines) == 1 and "not an Azure VM" in lines[0], lines


def test_only_events_whose_vms_all_belong_to_the_job_are_approvable(imds):
    imds.events = [
        _event("mine", "Preempt", [VM]),
        _event("ours", "Redeploy", [VM, "batch-node-8"]),
        # Approving this one would hasten the reboot of another job's VM too.
        _event("shared", "Reboot", [VM, "other-jobs-vm"]),
    ]
    job = Job("batch-node-8")
    watcher = Watcher(ScheduledEvents(imds.url), interval=0.01, job=job).start()
    _until(lambda: watcher.noticed, "the notice")
    assert job.published == [VM]
    assert watcher.job_vms == {VM, "batch-node-8"}
    approve, foreign = watcher.approvable()
    assert [e.event_id for e in approve] == ["mine", "ours"]
    assert [e.event_id for e in foreign] == ["shared"]


def test_without_the_jobs_vm_names_only_events_of_this_vm_alone_are_approvable(imds):
    imds.events = [_event("mine", "Preempt", [VM]), _event("ours", "Reboot", [VM, "node-8"])]
    watcher = Watcher(ScheduledEvents(imds.url), interval=0.01).start()
    _until(lambda: watcher.noticed, "the notice")
    assert [[e.event_id for e in part] for part in watcher.approvable()] == [["mine"], ["ours"]]


def test_the_hold_lasts_while_the_event_is_listed_and_ends_when_it_ends(imds):
    imds.events = [_event("r", "Reboot", [VM])]
    watcher = Watcher(ScheduledEvents(imds.url), interval=0.01).start()
    _until(lambda: watcher.noticed, "the notice")
    result: list[bool] = []
    holding = threading.Thread(target=lambda: result.append(watcher.hold(WAIT * 2)))
    holding.start()
    asked = imds.events_asked()
    _until(lambda: imds.events_asked() > asked + 2, "the hold asking again")
    assert holding.is_alive()  # the event is still listed: the VM is about to go
    imds.events = []  # cancelled: it ended and this VM is still here
    holding.join(WAIT)
    assert result == [False]


def test_the_hold_ends_at_its_limit_or_on_release(imds):
    imds.events = [_event("r", "Reboot", [VM])]
    watcher = Watcher(ScheduledEvents(imds.url), interval=0.01).start()
    _until(lambda: watcher.noticed, "the notice")
    assert watcher.hold(0.05) is True
    watcher.release()
    assert watcher.hold(WAIT * 2) is True
