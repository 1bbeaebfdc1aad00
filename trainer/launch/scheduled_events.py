"""Azure Scheduled Events: the node's warning before a Spot eviction or maintenance.
Why it is built this way: docs/internals.md, `trainer/launch/scheduled_events.py`."""

from __future__ import annotations

import errno
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

IMDS = "http://169.254.169.254"
EVENTS_API = "2020-07-01"
COMPUTE_API = "2021-02-01"
INTERRUPTING = frozenset({"Preempt", "Terminate", "Reboot", "Redeploy"})
# The first answer may take two minutes (docs/internals.md); later ones come at once.
FIRST_CALL_SECONDS = 150.0
TIMEOUT_SECONDS = 10.0
POLL_SECONDS = 2.0
# After errors the watcher asks less often, but never less often than this: a Preempt gives
# 30 s of notice.
MAX_BACKOFF_SECONDS = 10.0
# Socket errors that mean nothing answers at the address: not an Azure VM (a laptop, a test).
NOT_THERE = frozenset({errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH})


@dataclass(frozen=True)
class Event:
    event_id: str
    event_type: str
    not_before: str  # the platform's time after which it acts (empty: already started)
    resources: tuple[str, ...] = ()  # the VMs it affects


class ScheduledEvents:
    """A client for this VM's scheduled events; ``pending()`` raises what the request raised
    (``OSError``, ``ValueError``), the watcher decides what it means."""

    def __init__(
        self,
        base_url: str = IMDS,
        timeout: float = TIMEOUT_SECONDS,
        first_timeout: float = FIRST_CALL_SECONDS,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.first_timeout = first_timeout
        self._answered = False  # whether the service answered a request for events
        self._vm_name: str | None = None

    def _request(self, path: str, body: bytes | None = None, timeout: float | None = None) -> bytes:
        # IMDS refuses requests without this header, and any that pass through a proxy.
        request = urllib.request.Request(
            f"{self.base_url}{path}", data=body, headers={"Metadata": "true"}
        )
        if body is not None:
            request.add_header("Content-Type", "application/json")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=timeout or self.timeout) as response:
            return response.read()

    def vm_name(self) -> str:
        if self._vm_name is None:
            path = f"/metadata/instance/compute/name?api-version={COMPUTE_API}&format=text"
            self._vm_name = self._request(path).decode().strip()
        return self._vm_name

    def document(self) -> list[Event]:
        """Every event the service lists (for this VM's placement group)."""
        timeout = self.timeout if self._answered else self.first_timeout
        path = f"/metadata/scheduledevents?api-version={EVENTS_API}"
        document = json.loads(self._request(path, timeout=timeout))
        self._answered = True
        return [
            Event(
                str(item["EventId"]),
                str(item["EventType"]),
                str(item.get("NotBefore", "")),
                tuple(str(name) for name in item.get("Resources") or []),
            )
            for item in document.get("Events") or []
        ]

    def pending(self) -> list[Event]:
        """This VM's upcoming events that end or move it."""
        name = self.vm_name()
        return [e for e in self.document() if e.event_type in INTERRUPTING and name in e.resources]

    def approve(self, events: list[Event]) -> None:
        """Let the platform start ``events`` now (the workers have checkpointed)."""
        if not events:
            return
        body = json.dumps({"StartRequests": [{"EventId": e.event_id} for e in events]}).encode()
        self._request(f"/metadata/scheduledevents?api-version={EVENTS_API}", body)


def not_there(error: BaseException) -> bool:
    """Whether ``error`` says that nothing listens at the metadata address (a timeout does not:
    the first answer on an Azure VM may be two minutes late)."""
    reason = getattr(error, "reason", error)  # urllib wraps socket errors in URLError
    return isinstance(reason, OSError) and reason.errno in NOT_THERE


class JobVms(Protocol):
    """The VM names of the job's nodes: each launcher publishes its own, and reads them all."""

    def publish(self, vm_name: str) -> None: ...

    def names(self) -> set[str]: ...


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Watcher:
    """Asks for this VM's events every ``interval`` seconds in a daemon thread, until the first
    notice (kept in ``events``, with the job's VM names of that moment in ``job_vms``) or until
    nothing turns out to listen at the metadata address. ``say`` gets one line per kind of
    trouble, once."""

    def __init__(
        self,
        client: ScheduledEvents,
        interval: float = POLL_SECONDS,
        *,
        say: Callable[[str], None] = _stderr,
        job: JobVms | None = None,
    ) -> None:
        self.client = client
        self.interval = interval
        self.say = say
        self.job = job
        self.events: list[Event] = []
        self.job_vms: set[str] = set()
        self._said: set[str] = set()
        self._noticed = threading.Event()
        self._stopped = threading.Event()
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduled-events", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def _once(self, kind: str, message: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            self.say(message)

    def _run(self) -> None:
        delay, published = self.interval, False
        while not self._stopped.is_set():
            try:
                if not published:
                    self._publish(self.client.vm_name())
                    published = True
                events = self.client.pending()
            except (OSError, ValueError) as err:
                if not_there(err):
                    self.say(
                        f"scheduled events: nothing answers at {self.client.base_url} ({err}): "
                        "not an Azure VM; no longer watching"
                    )
                    return
                self._once(
                    "error",
                    f"scheduled events: no answer from {self.client.base_url} yet ({err}); the "
                    "first call on a VM can take two minutes: still asking",
                )
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
            else:
                delay = self.interval
                if events:
                    self.job_vms = self._job_vms()
                    self.events = events
                    self._noticed.set()
                    return
            self._stopped.wait(delay)

    def _publish(self, name: str) -> None:
        if self.job is None:
            return
        try:
            self.job.publish(name)
        except OSError as err:
            self._once("publish", f"scheduled events: cannot publish this VM's name: {err}")

    def _job_vms(self) -> set[str]:
        own = {self.client.vm_name()}
        if self.job is None:
            return own
        try:
            return own | self.job.names()
        except OSError as err:
            self.say(f"scheduled events: cannot read the job's VM names: {err}")
            return own

    @property
    def noticed(self) -> bool:
        return self._noticed.is_set()

    def stop(self) -> None:
        self._stopped.set()

    def approvable(self) -> tuple[list[Event], list[Event]]:
        """The noticed events split into those whose VMs all belong to the job (to approve) and
        those that also name other VMs (approving would hasten those VMs' event too)."""
        mine = [e for e in self.events if set(e.resources) <= self.job_vms]
        return mine, [e for e in self.events if e not in mine]

    def hold(self, seconds: float) -> bool:
        """Wait while the noticed events are still listed, at most ``seconds`` or until
        ``release()``. False when they ended and this VM is still here (the platform cancelled
        them); True otherwise."""
        deadline = time.monotonic() + seconds
        wanted = {e.event_id for e in self.events}
        while time.monotonic() < deadline and not self._released.is_set():
            try:
                listed = {e.event_id for e in self.client.document()}
            except (OSError, ValueError):
                listed = wanted  # no answer: the event may still come
            if not wanted & listed:
                return False
            self._released.wait(min(self.interval, max(0.0, deadline - time.monotonic())))
        return True

    def release(self) -> None:
        self._released.set()
