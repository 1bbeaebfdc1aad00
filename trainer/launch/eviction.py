"""Scheduled Events on the launcher's side: watching this VM's events (a Spot eviction,
maintenance), approving those that take only this job's VMs once the workers checkpointed, and
holding the VM until the platform takes it, so that Batch requeues the task without counting a
retry. The events themselves: ``trainer.launch.scheduled_events``.
"""

from __future__ import annotations

import signal

from trainer.launch.batch_env import Node
from trainer.launch.records import RunLog
from trainer.launch.scheduled_events import IMDS, ScheduledEvents, Watcher
from trainer.launch.store import Store

# After a scheduled event's checkpoint the launcher of the VM it takes does not exit: Batch counts
# a non-zero exit as a retry of the task (maxTaskRetryCount, infra/batch.py), while a task whose
# node is rebooted or disappears is retried by Batch's recovery, "independent of and ... not
# counted against the maxTaskRetryCount" (the Batch REST spec, TaskAddParameter), and a Spot
# node's preemption requeues its tasks (articles/batch/batch-spot-vms.md). So the launcher waits
# for the platform to take the VM: at most this long (the longest minimum notice of an event
# that takes the VM, a Reboot's 15 minutes, and five more), or until the event ends without
# taking it (cancelled): then it exits, which costs a retry.
HOLD_SECONDS = 20 * 60


class StoreVms:
    """The VM names of this job's nodes (``trainer.launch.scheduled_events.JobVms``), exchanged
    through the launchers' store: each launcher puts the name its metadata service gives
    (``vm-<index>``); the watcher reads them all when an event comes. Batch tells a node the
    others' addresses (``AZ_BATCH_HOST_LIST``), not their VM names, which Scheduled Events
    lists; asking Batch's API for them would need a credential on the node. A node that has not
    published (yet) is missing, so an event naming its VM is not approved."""

    def __init__(self, store: Store, nodes: int, index: int) -> None:
        self.store, self.nodes, self.index = store, nodes, index

    def publish(self, vm_name: str) -> None:
        self.store.put(f"vm-{self.index}", vm_name)

    def names(self) -> set[str]:
        return {name for i in range(self.nodes) if (name := self.store.get(f"vm-{i}"))}


def watch(env: dict[str, str], store: Store, node: Node, log: RunLog) -> Watcher:
    """Start watching this VM's scheduled events (``AZURE_IMDS_URL``, default the metadata
    service); the job's VMs are the names every launcher publishes in the store."""
    job_vms = StoreVms(store, len(node.hosts), node.index)
    events = ScheduledEvents(env.get("AZURE_IMDS_URL", IMDS))
    return Watcher(events, say=log.say, job=job_vms).start()


def approve(watcher: Watcher, log: RunLog) -> None:
    """The workers have checkpointed: let the platform go ahead without waiting out the notice,
    for the events that take only this job's VMs."""
    approvable, foreign = watcher.approvable()
    for event in foreign:
        others = sorted(set(event.resources) - watcher.job_vms)
        log.say(
            f"not approving {event.event_type} {event.event_id}: it also takes VMs outside "
            f"this job ({', '.join(others)}); the platform goes ahead at {event.not_before}"
        )
    if not approvable:
        return
    try:
        watcher.client.approve(approvable)
        log.say("approved the scheduled event(s): the checkpoint is written")
    except OSError as err:
        log.say(f"could not approve the scheduled event(s): {err}")


def hold(watcher: Watcher, log: RunLog) -> None:
    """Wait for the platform to take this VM (``HOLD_SECONDS``); a signal ends the wait."""
    log.say(
        "waiting for the platform to take this VM: Batch then requeues the task without "
        "counting a retry"
    )
    signal.signal(signal.SIGTERM, lambda _signum, _frame: watcher.release())
    if not watcher.hold(HOLD_SECONDS):
        log.say("the scheduled event ended without taking this VM: exiting (Batch retries)")
    else:
        log.say("stopped waiting for the platform to take this VM: exiting (Batch retries)")
