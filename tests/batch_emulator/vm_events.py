"""The platform under an emulated pool: the pool's Scheduled Events, listed on every node and
started when due, and what a started event or a restart from inside a VM does to its node.

Scheduled Events: ``articles/virtual-machines/linux/scheduled-events.md``. A VM an event takes
loses its processes (a task running there is requeued, not retried) and comes back after
``REJOIN_SECONDS`` to run the start task again, its disks emptied where the event loses them."""

from __future__ import annotations

import contextlib
import email.utils
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.batch_emulator.node import Node, reinitialize
from tests.batch_emulator.processes import ClusterClosed
from tests.batch_emulator.start_task import run_start_task

if TYPE_CHECKING:
    from tests.batch_emulator.cluster import Cluster

# What a restart from inside the VM (systemctl reboot) does to the task running there. Batch
# "will retry Tasks when a recovery operation is triggered on a Node ... when an unhealthy Node
# is rebooted ... not counted against the maxTaskRetryCount" (BatchTask's remarks), but does not
# say whether a restart it did not order is one: "recovery", the task requeued without using a
# retry, or "failure", its processes die and the try fails as any other.
GUEST_RESTART_READINGS = ("recovery", "failure")
# An approved event starts "when possible", not at once: the emulated platform takes its VMs
# this long after the approval.
APPROVED_START_SECONDS = 2.0
# A taken node comes back (a reboot, or Spot capacity found again) after this long and runs
# the start task again ("the nodes keep their IDs, but are reinitialized, going through
# Creating and Starting states", articles/batch/batch-spot-vms.md).
REJOIN_SECONDS = 1.0
# Events after which the VM's temporary disk, where the Batch tree lives, starts empty: a
# Redeploy moves the VM, "ephemeral disks are lost" (scheduled-events.md); a Preempt deletes the
# Spot VM, "leading to loss of any data stored locally", and preempted nodes "keep their IDs, but
# are reinitialized" (batch-spot-vms.md); a Terminate deletes it. Read 2026-11-28.
DISK_LOST = ("Preempt", "Redeploy", "Terminate")


class VmEvents:
    """The pool's Scheduled Events (one placement group: every node lists them all) in
    ``scheduled_events``, the nodes' approvals in ``approvals``, and the platform's thread."""

    def __init__(self, cluster: Cluster, specs: Path, logs: Path) -> None:
        self.cluster = cluster
        self.scheduled_events = specs / "scheduled-events.json"  # what each node's IMDS lists
        self.approvals = logs / "scheduled-approvals.jsonl"  # what the nodes' IMDS received
        self._lock = threading.Lock()
        self._scheduled: list[dict[str, Any]] = []
        self._due: dict[str, float] = {}  # event id -> when the platform starts it
        self.stopped = threading.Event()  # the cluster closed: nothing is taken or rejoins

    def start(self) -> None:
        self._write()
        threading.Thread(target=self._platform, name="platform", daemon=True).start()

    def schedule_event(self, kind: str, vm_names: list[str], notice: float) -> str:
        """An event for ``vm_names`` (the pool's or others: events reach the whole placement
        group), which the platform starts ``notice`` seconds from now or soon after a VM
        approves it; returns its id. Azure preempts only Spot nodes ("The Spot Virtual Machine
        is being deleted", scheduled-events.md, read 2026-11-28)."""
        mine = {n.vm_name: n for n in self.cluster.nodes}
        dedicated = [v for v in vm_names if v in mine and not mine[v].spot]
        if kind == "Preempt" and dedicated:
            raise ValueError(f"Preempt names dedicated nodes {dedicated}: only Spot nodes are")
        event_id = f"emulated-{kind.lower()}-{len(self._due) + 1}"
        not_before = email.utils.formatdate(time.time() + notice, usegmt=True)
        with self._lock:
            self._scheduled.append(
                {
                    "EventId": event_id,
                    "EventStatus": "Scheduled",
                    "EventType": kind,
                    "ResourceType": "VirtualMachine",
                    "Resources": vm_names,
                    "NotBefore": not_before,
                    "Description": "",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            )
            self._due[event_id] = time.monotonic() + notice
        self._write()
        self.cluster.log(f"scheduled event {event_id}: {kind} {vm_names} not before {not_before}")
        return event_id

    def approved(self) -> list[tuple[str, str]]:
        """(VM, event id) of every approval the nodes sent."""
        if not self.approvals.exists():
            return []
        found = []
        for line in self.approvals.read_text().splitlines():
            record = json.loads(line)
            found += [(record["vm"], r["EventId"]) for r in record.get("StartRequests", [])]
        return found

    def _write(self) -> None:
        with self._lock:
            data = json.dumps(self._scheduled)
        staged = self.scheduled_events.with_suffix(".tmp")
        staged.write_text(data)
        os.chmod(staged, 0o644)
        staged.replace(self.scheduled_events)

    def _platform(self) -> None:
        """Starts each event when due: at its NotBefore, or APPROVED_START_SECONDS after a VM
        approved it ("This call indicates to Azure that it can shorten the minimum
        notification time (when possible)"). A started event is no longer listed, and takes
        the pool's VMs it names."""
        seen = 0
        while not self.stopped.wait(0.2):
            for node in self.cluster.nodes:
                restart = node.hw / "reboot-requested"
                if restart.exists():
                    restart.unlink()
                    recovery = self.cluster.guest_restart == "recovery"
                    self.take(node, "a restart from the node itself", recovery)
            approvals = self.approved()
            for _, event_id in approvals[seen:]:
                if event_id in self._due:
                    soon = time.monotonic() + APPROVED_START_SECONDS
                    self._due[event_id] = min(self._due[event_id], soon)
            seen = len(approvals)
            now = time.monotonic()
            with self._lock:
                due = [e for e in self._scheduled if self._due[e["EventId"]] <= now]
                self._scheduled = [e for e in self._scheduled if e not in due]
            if not due:
                continue
            self._write()
            for event in due:
                self.cluster.log(f"platform starts {event['EventId']}: {event['EventType']}")
                for node in self.cluster.nodes:
                    if node.vm_name in event["Resources"] and event["EventType"] != "Freeze":
                        self.take(node, event["EventType"])

    def take(self, node: Node, kind: str, recovery: bool = True) -> None:
        """The VM goes away (preempted, rebooted, redeployed, deleted): every process on it
        dies with it; the node comes back after REJOIN_SECONDS and runs the start task. Unless
        ``recovery``, its tasks' processes just die: the tries fail as any other."""
        node.state = "preempted" if kind == "Preempt" else "rebooting"
        self.cluster.log(f"node {node.index}: taken by {kind}")
        for run in list(self.cluster.runs):
            run.node_lost(node, recovery)
        for unit in node.units:
            unit.kill()
        node.units.clear()
        node.kmsg.write_text("")  # a new boot, a new kernel log
        if kind in DISK_LOST:
            node.reimages += 1
            reinitialize(node)
        else:
            node.reboots += 1
        if self.cluster.pool.nvme_disks:
            # The local NVMe disks go with the VM as the temporary disk does; a restart keeps
            # them, and the kernel assembles what it finds on them again (nvme.py).
            disks = self.cluster.nvme(node)
            disks.lose() if kind in DISK_LOST else disks.boot()

        def rejoin() -> None:
            if self.stopped.wait(REJOIN_SECONDS):  # a closed cluster boots nothing
                return
            with contextlib.suppress(ClusterClosed):  # closed while it booted
                run_start_task(self.cluster, node)

        threading.Thread(target=rejoin, daemon=True).start()
