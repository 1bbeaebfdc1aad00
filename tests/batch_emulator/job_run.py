"""One job with one (multi-instance) task on an emulated pool, run as Batch schedules it: its
nodes chosen (``placement.py``) and prepared (``job_prep.py``), each try's coordination commands
on every node and the application command on the primary (``articles/batch/batch-mpi.md``),
retries counted or requeued, a terminate under either reading of ``STOP_MODES``."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.batch_emulator.containers import run_task_process
from tests.batch_emulator.job_prep import JobPreparation
from tests.batch_emulator.node import Node
from tests.batch_emulator.outputs import upload_outputs
from tests.batch_emulator.placement import place
from tests.batch_emulator.processes import Proc
from tests.batch_emulator.tasks import (
    env_settings,
    job_task_env,
    multi_instance_env,
    task_folders,
    user_of,
)
from tests.support.fake_batch import COORDINATION_PREFIX

if TYPE_CHECKING:
    from tests.batch_emulator.cluster import Cluster

# How a terminated task's containers end. Batch documents only that it "terminates any running
# Tasks" (REST reference, Job - Terminate; Task - Terminate), no signal, no grace period, and
# whether its agent uses `docker stop` at all is not documented (containers have been seen to
# outlive a terminate: Azure/batch-shipyard #308). So a terminate runs under either reading:
# "stop", `docker stop` as Docker documents it ("The main process inside the container will
# receive SIGTERM, and after a grace period, SIGKILL", docs.docker.com, docker container stop;
# the container's other processes get nothing from Docker), or "kill", SIGKILL at once.
STOP_MODES = ("stop", "kill")
# Between SIGTERM and SIGKILL in a stop: Docker's default (`docker stop -t`, 10 s). Whether Batch
# passes its own timeout to the Docker API's stop (which overrides a container's --stop-timeout)
# is not documented, so the run options' --stop-timeout/--stop-signal are not honoured here.
STOP_GRACE_SECONDS = 10.0


@dataclass
class Try:
    exit_code: int | None
    reason: str
    seconds: float
    recovered: bool = False  # a node of the try was taken: requeued, not a retry


class JobRun(threading.Thread):
    """One job with one (multi-instance) task, run as Batch schedules it."""

    def __init__(self, cluster: Cluster, job: dict[str, Any], task: dict[str, Any]) -> None:
        super().__init__(daemon=True, name=f"job-{job['id']}")
        self.cluster, self.job, self.task = cluster, job, task
        self.state = "active"  # the task's state: active, preparing, running, completed
        self.reason = ""
        self.tries: list[Try] = []
        self.nodes: list[Node] = []
        self.master: Node | None = None
        self.exit_code: int | None = None
        self.terminated = False
        self.error: BaseException | None = None
        self.running: dict[int, Proc] = {}
        self.application: Proc | None = None
        self.preparation = JobPreparation(cluster, job)
        self.retry_count = 0  # Batch's executionInfo.retryCount
        self.requeue_count = 0  # tries ended by the platform taking a node
        self.finished = threading.Event()
        self._terminate = threading.Event()
        self._stop_how = "stop"
        self._lost: set[int] = set()  # nodes of the current try the platform took
        self.failed_node: Node | None = None  # whose command failed the last try
        # The node a "move" placement leaves out after a failed try, when the test names it
        # (Batch sees only the task's exit; which node a retry avoids is not documented).
        self.leave_out: Node | None = None

    # --- public ---
    def wait(self, timeout: float) -> bool:
        return self.finished.wait(timeout)

    def terminate(self, how: str = "stop") -> None:
        """Terminate the task (or its job) under one reading of ``STOP_MODES``: ``stop``, SIGTERM
        to each container's first process and, after STOP_GRACE_SECONDS, SIGKILL to them all;
        ``kill``, SIGKILL to them all at once."""
        if how not in STOP_MODES:
            raise ValueError(f"how={how!r}: one of {STOP_MODES}")
        self._stop_how = how
        self._terminate.set()

    def task_dir(self, node: Node) -> Path:
        return node.job_dir(self.job["id"]) / self.task["id"]

    def processes(self, node: Node) -> list[int]:
        proc = self.running.get(node.index)
        pids = proc.pids() if proc else []
        if self.application is not None and node is self.master:
            pids += self.application.pids()
        return pids

    @property
    def prep_exit(self) -> dict[int, int | None]:
        """Each node's last exit code of the job preparation."""
        return self.preparation.exits

    def prep_failed(self) -> set[int]:
        return self.preparation.failed()

    def prep_output(self, node: Node) -> str:
        """What the job preparation task wrote on ``node`` (stdout.txt, stderr.txt)."""
        return self.preparation.output(node)

    def prep_dir(self, node: Node) -> Path | None:
        """The job preparation's task folder on ``node`` (None: the job has none)."""
        return self.preparation.folder(node)

    # --- scheduling ---
    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # reported to the test through .error
            self.error = error
            self.reason = f"emulator error: {error}"
        finally:
            self._stop_all()
            self.cluster.sync_nfs()
            self.finished.set()

    def _eligible(self) -> list[Node]:
        return [n for n in self.cluster.nodes if n.state == "idle" and n.scheduling == "enabled"]

    def _run(self) -> None:
        pool = self.cluster.pool
        settings = self.task.get("multiInstanceSettings")
        instances = int((settings or {}).get("numberOfInstances") or 1)
        if settings and (not pool.inter_node_communication or pool.task_slots_per_node != 1):
            # batch-mpi.md: such a pool never schedules a multi-instance task; it stays active.
            self.reason = "pool lacks inter-node communication or has taskSlotsPerNode > 1"
            return
        retries = int((self.task.get("constraints") or {}).get("maxTaskRetryCount") or 0)
        attempt = 0
        while self._schedule(instances):
            self.state = "running"
            # batch-mpi.md, "Master node": one of the nodes is the master and runs the primary.
            # The docs do not order AZ_BATCH_HOST_LIST; the emulator lists the master last, so
            # nothing may assume the first host is the master.
            self.master = self.nodes[-1]
            self._lost, self.failed_node = set(), None
            started = time.monotonic()
            code, reason = self._try(attempt, instances)
            attempt += 1
            recovered = bool(self._lost) and not self.terminated
            if recovered:
                reason = f"nodes {sorted(self._lost)} taken by the platform ({reason})"
            self.tries.append(Try(code, reason, time.monotonic() - started, recovered))
            self.cluster.log(f"task try {attempt - 1}: exit {code} ({reason})")
            self.exit_code = code
            if recovered:
                # A node that disappears (or is rebooted) under a task triggers Batch's
                # recovery, which retries the task "independent of and ... not counted against
                # the maxTaskRetryCount" (the REST spec's TaskAddParameter); a preempted Spot
                # node's tasks "are requeued and run again when capacity returns"
                # (batch-spot-vms.md). For a multi-instance task that is the whole task.
                self.requeue_count += 1
                self.state = "active"
                continue
            # BatchTaskConstraints.maxTaskRetryCount: "The Batch service retries a Task if its
            # exit code is nonzero"; a terminated task is not retried. Any nonzero code counts:
            # exit conditions (ExitOptions.jobAction none/disable/terminate) act only once the
            # task completes, "with a non-zero exit code after exhausting its retry count"
            # (JobAddParameter.onTaskFailure).
            if code == 0 or self.terminated or self.retry_count >= retries:
                break
            self.retry_count += 1
        self.state = "completed"
        if self.tries:
            self.reason = self.tries[-1].reason

    def _schedule(self, instances: int) -> bool:
        """Chooses the task's nodes (and runs the job preparation on them); False when the
        task was terminated while it waited for nodes."""
        while True:
            candidates = [n for n in self._eligible() if n.index not in self.prep_failed()]
            # A requeue (a node taken) names no failed node: the platform's doing, not the task's.
            failed = self.leave_out or self.failed_node or self.master
            if self.tries and self.tries[-1].recovered:
                failed = None
            chosen = place(candidates, instances, placement=self.cluster.placement,
                           previous=self.nodes, failed=failed)  # fmt: skip
            if chosen is None:
                # Not enough usable nodes: the task is not scheduled; it stays active until
                # nodes come (a taken node comes back) or it is terminated.
                self.reason = (
                    f"needs {instances} nodes, {len(candidates)} usable "
                    f"({[(n.index, n.state) for n in self.cluster.nodes]})"
                )
                if self._terminate.wait(0.2):
                    self.terminated = True
                    self.state = "completed"
                    return False
                continue
            self.nodes = chosen
            # batch-job-prep-release.md: the job preparation task runs on each node scheduled
            # to run a task, before the task; with waitForSuccess (the default) a node whose
            # preparation failed after its retries gets no task of the job.
            if self.preparation.task is not None:
                self.state = "preparing"
            if self.preparation.ready(self.nodes):
                return True

    def node_lost(self, node: Node, recovery: bool = True) -> None:
        """The platform took ``node``. If a process of the current try still ran there, it dies
        with the VM and (under ``recovery``) the try is recovered (see ``_run``); a node whose
        part of the try had already returned loses nothing."""
        if self.state != "running" or node not in self.nodes:
            return
        procs = [self.running.get(node.index)]
        if node is self.master:
            procs.append(self.application)
        live = [p for p in procs if p is not None and not p.done.is_set()]
        if live and recovery:
            self._lost.add(node.index)
        for proc in live:
            proc.kill()

    def _try(self, attempt: int, instances: int) -> tuple[int | None, str]:
        """One try of the multi-instance task (batch-mpi.md): the coordination command on
        every node concurrently; the application command on the primary only once all of them
        returned 0; the primary's exit ends the task and its subtasks ("When the primary
        exits, all of the subtasks are terminated"); any subtask failure fails the task."""
        assert self.master is not None
        settings = self.task.get("multiInstanceSettings") or {}
        holder = self.cluster.hold_batch_port(self.master) if settings else None
        envs = {node.index: self._task_env(node, settings) for node in self.nodes}
        code: int | None = None
        try:
            code, reason = self._try_commands(attempt, settings, envs)
        finally:
            self._stop_all()
            if holder is not None:
                holder.kill()
                holder.wait()
        if self.master.index not in self._lost:  # a taken VM uploads nothing
            env, exit_code = envs[self.master.index], 1 if code is None else code
            upload_outputs(self.cluster, self.master, self.task, env, exit_code)
        return code, reason

    def _task_env(self, node: Node, settings: dict[str, Any]) -> dict[str, str]:
        """A node's environment for this try, its task folder made and emptied of old output."""
        assert self.master is not None
        task_dir = self.task_dir(node)
        task_folders(task_dir, user_of(self.task.get("userIdentity")))
        for stale in task_dir.glob("*.txt"):
            stale.unlink()
        env = job_task_env(self.cluster.pool, node, self.job["id"], self.task["id"], task_dir)
        prep_dir = self.prep_dir(node)
        if prep_dir is not None:
            env["AZ_BATCH_JOB_PREP_DIR"] = str(prep_dir)
            env["AZ_BATCH_JOB_PREP_WORKING_DIR"] = str(prep_dir / "wd")
        if settings:
            env.update(multi_instance_env(node, self.nodes, self.master, task_dir))
        env.update(env_settings(self.task))
        return env

    def _try_commands(
        self, attempt: int, settings: dict[str, Any], envs: dict[int, dict[str, str]]
    ) -> tuple[int | None, str]:
        master = self.master
        assert master is not None
        if settings:
            code, reason = self._coordinate(attempt, settings, envs)
            if self.terminated:
                return code, "terminated during the coordination commands"
            if code != 0:
                return code, reason
        if self._terminate.is_set():
            self.terminated = True
            return None, "terminated before the application command"
        self.application = self._start(
            master, f"app-try{attempt}", self.task["commandLine"], envs[master.index], False
        )
        code = self._wait([self.application])[0]
        if self.terminated:
            return code, "terminated during the application command"
        return code, f"application command exited {code}"

    def _coordinate(
        self, attempt: int, settings: dict[str, Any], envs: dict[int, dict[str, str]]
    ) -> tuple[int, str]:
        keep_alive = self.cluster.lifecycle == "survive"
        for node in self.nodes:
            # A subtask's stdout.txt/stderr.txt are its coordination command's (batch-mpi.md);
            # the primary's go where the cluster's reading puts them (COORDINATION_OUTPUTS):
            # before its application command's in the same files, or in files of their own.
            apart = node is self.master and self.cluster.coordination_output == "apart"
            prefix = COORDINATION_PREFIX if apart else ""
            name, command = f"coord-n{node.index}-try{attempt}", settings["coordinationCommandLine"]
            self.running[node.index] = self._start(
                node, name, command, envs[node.index], keep_alive, prefix
            )
        procs = [self.running[n.index] for n in self.nodes]
        codes = self._wait(procs, stop_on_failure=True)
        failed = [(n, c) for n, c in zip(self.nodes, codes, strict=True) if c not in (None, 0)]
        if failed:
            node, code = failed[0]
            self.failed_node = node
            role = "primary" if node is self.master else "subtask"
            return code, f"coordination command on node {node.index} ({role}) exited {code}"
        if any(code is None for code in codes):
            return 1, "coordination commands stopped before they returned"
        return 0, "coordination commands returned 0"

    def _wait(self, procs: list[Proc], stop_on_failure: bool = False) -> list[int | None]:
        """Until every process reported, or one failed (with ``stop_on_failure``), or a
        terminate request was handled."""
        while True:
            codes = [p.code if p.done.is_set() else None for p in procs]
            if all(p.done.is_set() for p in procs):
                return codes
            if stop_on_failure and any(p.done.is_set() and p.code != 0 for p in procs):
                return codes
            if self._terminate.is_set() and not self.terminated:
                self.terminated = True
                stop_processes(self._live(), self._stop_how, self.cluster.log)
                return [p.code for p in procs]
            time.sleep(0.1)

    def _start(
        self, node: Node, name: str, command: str, env: dict[str, str], keep_alive: bool,
        prefix: str = "",
    ) -> Proc:  # fmt: skip
        """One of the task's processes on ``node``, its output in the node's task folder."""
        task_dir = self.task_dir(node)
        return run_task_process(self.cluster, node, name, self.task, command, task_dir,
                                self.prep_dir(node), env, task_dir, keep_alive, prefix)  # fmt: skip

    def _live(self) -> list[Proc]:
        procs = list(self.running.values())
        if self.application is not None:
            procs.append(self.application)
        return procs

    def _stop_all(self) -> None:
        for proc in self._live():
            proc.kill()
        self.running = {}


def stop_processes(live: list[Proc], how: str, log: Any) -> None:
    """A terminate's end of ``live`` under the reading ``how`` (``STOP_MODES``); ``log``
    takes a line of what happened."""
    if how == "stop":
        for proc in live:
            log(f"terminate: SIGTERM to {proc.name}: {proc.stop_signal(signal.SIGTERM)}")
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while time.monotonic() < deadline and not all(p.done.is_set() for p in live):
            time.sleep(0.1)
    for proc in live:
        if not proc.done.is_set():
            log(f"terminate: SIGKILL to {proc.name}")
        proc.kill()
