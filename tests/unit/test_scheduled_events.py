"""Scheduled Events against a fake Instance Metadata Service on 127.0.0.1 that answers like the
documented one: it refuses requests without ``Metadata: true``, serves the VM name and the
events document, and records the approvals it receives."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from trainer.scheduled_events import EVENTS_API, Event, ScheduledEvents

VM = "batch-node-7"


class FakeImds(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.events: list[dict] = []
        self.approved: list[dict] = []
        self.requests: list[tuple[str, str, str | None]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeImds

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self, method: str) -> None:
        url = urlparse(self.path)
        self.server.requests.append((method, url.path, self.headers.get("Metadata")))
        if self.headers.get("Metadata") != "true":
            self._answer(400, b'{"error": "Bad request. Required metadata header not specified"}')
            return
        api = parse_qs(url.query).get("api-version", [""])[0]
        if url.path == "/metadata/instance/compute/name" and method == "GET":
            self._answer(200, VM.encode(), "text/plain")
        elif url.path == "/metadata/scheduledevents" and api == EVENTS_API:
            if method == "GET":
                document = {"DocumentIncarnation": 2, "Events": self.server.events}
                self._answer(200, json.dumps(document).encode())
            else:
                length = int(self.headers.get("Content-Length", 0))
                self.server.approved.append(json.loads(self.rfile.read(length)))
                self._answer(200, b"")
        else:
            self._answer(404, b"{}")

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    server = FakeImds()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _event(event_id: str, kind: str, resources: list[str]) -> dict:
    return {
        "EventId": event_id,
        "EventStatus": "Scheduled",
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "NotBefore": "Sun, 22 Nov 2026 11:00:30 GMT",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


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
