"""This node's workers: each one's environment for its engine (``worker_envs``), starting them
(``Workers``) and watching them and the other nodes until the run ends (``supervise``): the
first failure anywhere stops every node, a signal or a scheduled event makes them checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from trainer.common.exit_codes import WATCHDOG_EXIT
from trainer.launch.batch_env import LaunchError, Node
from trainer.launch.records import Outcome, RunLog
from trainer.launch.rendezvous import gloo_worker_env, torch_worker_env
from trainer.launch.scheduled_events import Watcher
from trainer.launch.stop import STOP
from trainer.launch.store import POLL_SECONDS, Store
from trainer.settings.choices import TORCH_DISTRIBUTED_BACKENDS

# The engines started the way torchrun starts them: the trainer's torch.distributed ones, and
# ``torch`` for a job's own command (a torchrun-style script, Accelerate, Lightning).
TORCH_ENGINES = (*TORCH_DISTRIBUTED_BACKENDS, "torch")
# The engines the launcher starts: Horovod, and those started the way torchrun starts them.
# (``local`` is one process without a process group: nothing to launch on several nodes.)
LAUNCHED_BACKENDS = ("horovod", *TORCH_ENGINES)
# How long a launcher tolerates an unreachable store before it gives up on the job.
STORE_LOST_SECONDS = 10
KILL_GRACE_SECONDS = 10
# After a worker's step watchdog fired, how long the node's other workers get to fire theirs:
# each one's limit runs from its own last step, so theirs end within a step or two of it.
WATCHDOG_GATHER_SECONDS = 30


def check_engine(backend: str) -> str:
    """``backend`` (the launcher's ``--backend``) when the launcher can start it."""
    if backend not in LAUNCHED_BACKENDS:
        hint = " (local is one process: run dt-train without the launcher)"
        raise LaunchError(
            f"backend={backend}: the launcher starts {', '.join(LAUNCHED_BACKENDS)} workers on "
            f"every node; choose one of them{hint if backend == 'local' else ''}"
        )
    return backend


def worker_envs(
    engine: str,
    node: Node,
    slots: int,
    base: dict[str, str],
    torch_port: int | None = None,
    *,
    token: str,
) -> list[dict[str, str]]:
    """Each of this node's ``slots`` workers' environment: ``base`` (the inherited one with the
    VM size's fabric settings) and the engine's rendezvous variables, ``torch_port`` being
    ``MASTER_PORT`` for a torch.distributed engine (``torch_master_port``) and ``token`` the
    job's, which Horovod's workers send to the master's store."""
    nodes = len(node.hosts)
    if engine in TORCH_ENGINES:
        if torch_port is None:
            raise ValueError(f"backend={engine}: needs torch_port")
        return [
            {
                **base,
                **torch_worker_env(
                    node.master_ip,
                    torch_port,
                    node.iface,
                    nodes,
                    node.master_first_rank,
                    slots,
                    local,
                ),
            }
            for local in range(slots)
        ]
    return [
        {
            **base,
            **gloo_worker_env(
                node.master_ip, node.port, token, node.iface, node.hosts, node.index, slots, local
            ),
        }
        for local in range(slots)
    ]


class Workers:
    """This node's worker processes, each in its own session so a kill reaches its children;
    their output goes through ``log``."""

    def __init__(
        self,
        command: list[str],
        envs: list[dict[str, str]],
        log: RunLog,
        cwd: Path | None = None,
    ) -> None:
        self.processes = [
            subprocess.Popen(
                command,
                env=env,
                cwd=cwd,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for env in envs
        ]
        self._pumps = [
            threading.Thread(target=_pump, args=(process.stdout, log), daemon=True)
            for process in self.processes
        ]
        for pump in self._pumps:
            pump.start()

    def join_output(self, seconds: float = 5) -> None:
        """Let the output threads copy what the exited workers left in their pipes."""
        deadline = time.monotonic() + seconds
        for pump in self._pumps:
            pump.join(max(0.0, deadline - time.monotonic()))

    def signal(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signum)

    def failed(self) -> tuple[int, int] | None:
        """(local rank, exit code) of the first worker that exited non-zero."""
        for local, process in enumerate(self.processes):
            code = process.poll()
            if code not in (None, 0):
                return local, code
        return None

    def all_done(self) -> bool:
        return all(process.poll() == 0 for process in self.processes)

    def stop(self, grace: float) -> None:
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(p.poll() is None for p in self.processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.signal(signal.SIGKILL)
        for process in self.processes:
            process.wait()


def _pump(stream: IO[bytes], log: RunLog) -> None:
    for line in iter(stream.readline, b""):
        log.write(line.decode("utf-8", errors="replace"), sys.stdout)
    stream.close()


def watchdog_reason(node: Node, workers: Workers, gather: float) -> str:
    """The node's line once a worker's step watchdog fired (trainer.watch.watchdog): which workers'
    fired and which did not, given ``gather`` seconds to. A worker blocked in a collective
    cannot tell which peer is missing; one that did not fire (wedged below Python, or ended
    another way) is the suspect, as is the rank the flight recorders show behind."""
    deadline = time.monotonic() + gather
    while any(p.poll() is None for p in workers.processes) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    codes = [process.poll() for process in workers.processes]
    fired = [str(local) for local, code in enumerate(codes) if code == WATCHDOG_EXIT]
    others = [
        f"{local} ({'still running' if code is None else f'exit {code}'})"
        for local, code in enumerate(codes)
        if code != WATCHDOG_EXIT
    ]
    return (
        f"node {node.label}: the step watchdog fired on worker {', '.join(fired)} (no step "
        f"completed within --step-timeout-minutes; stacks and collectives in the run's "
        f"watchdog/ folder); did not fire: {', '.join(others) or 'none'}"
    )


def supervise(
    node: Node, workers: Workers, store: Store, log: RunLog, watcher: Watcher | None = None
) -> Outcome:
    """Wait for the workers; end everything on the first failure anywhere. A signal (a Batch
    terminate) or a scheduled event on this VM (a Spot eviction, maintenance) makes the workers
    checkpoint and stop; the trainer stops every rank at the same step."""
    terminating = False

    def forward(signum: int) -> None:
        nonlocal terminating
        terminating = True
        log.say(f"signal {signum}: forwarding to the workers so they checkpoint")
        workers.signal(signal.SIGTERM)

    # A signal that came while the workers started is forwarded now (trainer.launch.stop).
    STOP.forward_to(forward)
    store_lost_since: float | None = None
    while True:
        if watcher is not None and watcher.noticed and not terminating:
            terminating = True
            notice = ", ".join(
                f"{e.event_type} {e.event_id} ({e.not_before})" for e in watcher.events
            )
            log.say(f"scheduled event {notice}: the workers checkpoint now")
            workers.signal(signal.SIGTERM)
        failure = workers.failed()
        if failure:
            local, code = failure
            reason = f"node {node.label} worker {local} exited with {code}"
            if code == WATCHDOG_EXIT:
                reason = watchdog_reason(node, workers, WATCHDOG_GATHER_SECONDS)
            log.say(f"{reason}: stopping the job on every node")
            # If the store is gone too, the others notice that the master stopped answering.
            with contextlib.suppress(OSError):
                store.put("failed", reason)
            workers.stop(KILL_GRACE_SECONDS)
            return Outcome(code if code > 0 else 1, reason)
        if workers.all_done():
            return _all_done(node, store, log, terminating)
        try:
            reason = store.get("failed")
            store_lost_since = None
        except OSError:
            reason = None
            store_lost_since = store_lost_since or time.monotonic()
            if time.monotonic() - store_lost_since > STORE_LOST_SECONDS and not terminating:
                reason = f"the master node {node.master_ip} stopped answering"
        if reason:
            log.say(f"{reason}: stopping this node's workers")
            workers.stop(KILL_GRACE_SECONDS if terminating else 2)
            return Outcome(1, reason, terminating)
        time.sleep(POLL_SECONDS)


def _all_done(node: Node, store: Store, log: RunLog, terminating: bool) -> Outcome:
    """This node's ending once its workers all exited 0, reported to the master. The master
    keeps its store up until every node reported (store.wait_for_other_nodes): gone before
    this report, it died, and this node's workers stopped because its workers did (a dead
    launcher's workers vote the run to a stop: watch.signals)."""
    try:
        store.put(f"done-{node.index}", "0")
        master_lost = False
    except OSError:
        master_lost = True
    if terminating:
        return Outcome(0, "stopped by a signal; the workers checkpointed", True)
    if master_lost:
        reason = (
            f"node {node.name}: every worker stopped, but the master node "
            f"{node.master_ip} stopped answering before this node reported"
        )
        log.say(f"{reason}: the run did not finish")
        return Outcome(1, reason)
    return Outcome(0, f"node {node.name}: every worker finished")
