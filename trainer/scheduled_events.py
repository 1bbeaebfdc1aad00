"""Azure Scheduled Events: the node's warning before a Spot eviction or maintenance.

The Instance Metadata Service lists upcoming events for the VM at
``/metadata/scheduledevents`` (Azure docs, articles/virtual-machines/linux/scheduled-events.md):
``Preempt`` (a Spot eviction, at least 30 s ahead), ``Terminate``, ``Reboot`` and ``Redeploy``
end or move the VM; ``Freeze`` only pauses it for seconds and is ignored here. An event may
name several VMs (events reach every VM of a scale set's placement group, which Batch pools
are), so only events whose ``Resources`` include this VM count. Approving an event
(``StartRequests``) lets the platform go ahead at once instead of waiting out the notice: the
launcher approves only after the workers have checkpointed.

Off Azure (a laptop, the tests' emulated nodes) the endpoint does not answer; the watcher then
stops asking after one try and says so once.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from dataclasses import dataclass

IMDS = "http://169.254.169.254"
EVENTS_API = "2020-07-01"
COMPUTE_API = "2021-02-01"
INTERRUPTING = frozenset({"Preempt", "Terminate", "Reboot", "Redeploy"})
TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class Event:
    event_id: str
    event_type: str
    not_before: str  # the platform's time after which it acts (empty: already started)


class ScheduledEvents:
    """A client for this VM's scheduled events; ``available`` turns False when the metadata
    service does not answer (not an Azure VM)."""

    def __init__(self, base_url: str = IMDS, timeout: float = TIMEOUT_SECONDS) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.available = True
        self._vm_name: str | None = None

    def _request(self, path: str, body: bytes | None = None) -> bytes:
        # IMDS refuses requests without this header, and any that pass through a proxy.
        request = urllib.request.Request(
            f"{self.base_url}{path}", data=body, headers={"Metadata": "true"}
        )
        if body is not None:
            request.add_header("Content-Type", "application/json")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=self.timeout) as response:
            return response.read()

    def vm_name(self) -> str:
        if self._vm_name is None:
            path = f"/metadata/instance/compute/name?api-version={COMPUTE_API}&format=text"
            self._vm_name = self._request(path).decode().strip()
        return self._vm_name

    def pending(self) -> list[Event]:
        """This VM's upcoming events that end or move it; [] when there are none or the
        metadata service is not there (``available`` then turns False)."""
        if not self.available:
            return []
        try:
            name = self.vm_name()
            document = json.loads(
                self._request(f"/metadata/scheduledevents?api-version={EVENTS_API}")
            )
        except (OSError, ValueError):
            self.available = False
            return []
        return [
            Event(str(item["EventId"]), str(item["EventType"]), str(item.get("NotBefore", "")))
            for item in document.get("Events") or []
            if item.get("EventType") in INTERRUPTING and name in (item.get("Resources") or [])
        ]

    def approve(self, events: list[Event]) -> None:
        """Let the platform start ``events`` now (the workers have checkpointed)."""
        if not events:
            return
        body = json.dumps({"StartRequests": [{"EventId": e.event_id} for e in events]}).encode()
        self._request(f"/metadata/scheduledevents?api-version={EVENTS_API}", body)


class Watcher:
    """Asks for this VM's events every ``interval`` seconds in a daemon thread, until the first
    notice (kept in ``events``) or until the metadata service turns out not to be there."""

    def __init__(self, client: ScheduledEvents, interval: float = 2.0) -> None:
        self.client = client
        self.interval = interval
        self.events: list[Event] = []
        self._noticed = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduled-events", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.is_set() and self.client.available:
            events = self.client.pending()
            if events:
                self.events = events
                self._noticed.set()
                return
            self._stopped.wait(self.interval)

    @property
    def noticed(self) -> bool:
        return self._noticed.is_set()

    def stop(self) -> None:
        self._stopped.set()
