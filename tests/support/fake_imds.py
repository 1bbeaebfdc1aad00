"""A fake Azure Instance Metadata Service on 127.0.0.1 that answers like the documented one
(articles/virtual-machines/linux/scheduled-events.md): it refuses requests without
``Metadata: true``, serves the VM name and the scheduled events document, and records the
approvals it receives. Like Azure it turns Scheduled Events on with the first request for events
and answers that request late ("You should expect a delayed response in your first call of up to
two minutes", section "Enabling and Disabling Scheduled Events"): here ``first_call_delay``
seconds (default ``FIRST_CALL_SECONDS``), or until ``enable()`` with ``first_call_delay=None``;
until then every request for events waits. Its events may name other VMs too: events reach every
VM of a scale set's placement group (section "Scope"), and a Batch pool is one. It also issues
the managed identity's tokens
(articles/active-directory/managed-identities-azure-resources/how-to-use-vm-token.md) for
``IDENTITY``: ``azure-identity`` asks there when ``AZURE_POD_IDENTITY_AUTHORITY_HOST`` names it,
and Azurite with ``--oauth basic`` accepts them (it checks issuer, audience and lifetime)."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from tests.support.replies import send_body
from trainer.launch.scheduled_events import EVENTS_API

VM = "batch-node-7"
# The client id of the one user-assigned identity this machine has (AZURE_CLIENT_ID on a node).
IDENTITY = "0b5c3e1d-6f8a-4c2e-9d7b-1a2b3c4d5e6f"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
TOKEN_PATH = "/metadata/identity/oauth2/token"
# Azure's first answer can take two minutes; here a few seconds: longer than the two seconds the
# watcher once waited before it gave up for good, short enough for the tests.
FIRST_CALL_SECONDS = 2.5


class FakeImds(ThreadingHTTPServer):
    def __init__(self, vm_name: str = VM, first_call_delay: float | None = FIRST_CALL_SECONDS):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.vm_name = vm_name
        self.events: list[dict] = []
        self.approved: list[dict] = []
        self.requests: list[tuple[str, str, str | None]] = []
        self.tokens_issued = 0
        self.first_call_delay = first_call_delay
        self.enabled = threading.Event()  # Scheduled Events on: requests for events answer
        self._lock = threading.Lock()
        self._asked = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def enable(self) -> None:
        """Scheduled Events on, as on a VM that asked within the last 24 hours."""
        self.enabled.set()

    def events_asked(self) -> int:
        """How many requests for events arrived (answered or still waiting)."""
        return sum(1 for _, path, _ in self.requests if path == "/metadata/scheduledevents")

    def wait_until_enabled(self) -> None:
        """The first request for events turns the service on, ``first_call_delay`` later."""
        with self._lock:
            first, self._asked = not self._asked, True
        if first and self.first_call_delay is not None:
            timer = threading.Timer(self.first_call_delay, self.enabled.set)
            timer.daemon = True
            timer.start()
        self.enabled.wait()

    def shutdown(self) -> None:
        self.enabled.set()  # release the requests still waiting
        super().shutdown()


class _Handler(BaseHTTPRequestHandler):
    server: FakeImds

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, code: int, body: bytes, kind: str = "application/json") -> None:
        # A client that stopped waiting (a late first answer) is no fault of the fake's.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            send_body(self, code, body, {"Content-Type": kind})

    def _route(self, method: str) -> None:
        url = urlparse(self.path)
        self.server.requests.append((method, url.path, self.headers.get("Metadata")))
        if self.headers.get("Metadata") != "true":
            self._answer(400, b'{"error": "Bad request. Required metadata header not specified"}')
            return
        api = parse_qs(url.query).get("api-version", [""])[0]
        if url.path == "/metadata/instance/compute/name" and method == "GET":
            self._answer(200, self.server.vm_name.encode(), "text/plain")
        elif url.path == TOKEN_PATH and method == "GET":
            self._token(parse_qs(url.query))
        elif url.path == "/metadata/scheduledevents" and api == EVENTS_API:
            self.server.wait_until_enabled()
            if method == "GET":
                document = {"DocumentIncarnation": 2, "Events": self.server.events}
                self._answer(200, json.dumps(document).encode())
            else:
                length = int(self.headers.get("Content-Length", 0))
                self.server.approved.append(json.loads(self.rfile.read(length)))
                self._answer(200, b"")
        else:
            self._answer(404, b"{}")

    def _token(self, query: dict[str, list[str]]) -> None:
        client_id = query.get("client_id", [IDENTITY])[0]
        if client_id != IDENTITY:
            body = {"error": "invalid_request", "error_description": "Identity not found"}
            self._answer(400, json.dumps(body).encode())
            return
        resource = query.get("resource", [""])[0]
        now = int(time.time())
        claims = {
            "aud": resource,
            "iss": f"https://sts.windows.net/{TENANT}/",
            "iat": now - 60,
            "nbf": now - 60,
            "exp": now + 3600,
            "appid": client_id,
            "oid": client_id,
            "sub": client_id,
            "tid": TENANT,
        }
        token = ".".join(_b64(part) for part in ({"alg": "RS256", "typ": "JWT"}, claims, {}))
        self.server.tokens_issued += 1
        body = {
            "access_token": token,
            "client_id": client_id,
            "expires_in": "3600",
            "expires_on": str(now + 3600),
            "ext_expires_in": "3600",
            "not_before": str(now - 60),
            "resource": resource,
            "token_type": "Bearer",
        }
        self._answer(200, json.dumps(body).encode())

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


@contextmanager
def serving(
    vm_name: str = VM, first_call_delay: float | None = FIRST_CALL_SECONDS
) -> Iterator[FakeImds]:
    server = FakeImds(vm_name, first_call_delay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def event(event_id: str, kind: str, resources: list[str]) -> dict:
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
