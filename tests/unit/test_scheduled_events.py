"""Scheduled Events against a fake Instance Metadata Service on 127.0.0.1 (tests/fake_imds.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.fake_imds import VM, FakeImds, serving
from tests.fake_imds import event as _event
from trainer.scheduled_events import Event, ScheduledEvents


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with serving() as server:
        yield server


def test_only_this_vms_interrupting_events_count(imds):
    imds.events = [
        _event("a", "Preempt", [VM]),
        _event("b", "Freeze", [VM]),  # a pause of seconds: nothing to save
        _event("c", "Reboot", ["another-node"]),  # same placement group, not this VM
        _event("d", "Redeploy", ["another-node", VM]),
    ]
    events = ScheduledEvents(imds.url).pending()
    assert [(e.event_id, e.event_type) for e in events] == [("a", "Preempt"), ("d", "Redeploy")]
    assert all(header == "true" for _, _, header in imds.requests)


def test_no_events_is_nothing_pending(imds):
    assert ScheduledEvents(imds.url).pending() == []


def test_approval_posts_the_start_requests(imds):
    watcher = ScheduledEvents(imds.url)
    watcher.approve([Event("a", "Preempt", ""), Event("d", "Terminate", "")])
    assert imds.approved == [{"StartRequests": [{"EventId": "a"}, {"EventId": "d"}]}]
    watcher.approve([])  # nothing to approve: no request
    assert len(imds.approved) == 1


def test_off_azure_the_watcher_gives_up_after_one_try():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    watcher = ScheduledEvents(f"http://127.0.0.1:{port}", timeout=0.5)
    assert watcher.pending() == [] and watcher.available is False
    assert watcher.pending() == []  # no second attempt
