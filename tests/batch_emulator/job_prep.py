"""A job's preparation task on the nodes its task's tries get (``batch-job-prep-release.md``):
it runs on each node before the job's first task there, again after a reimage (and, with
``rerunOnNodeRebootAfterSuccess``, after a reboot); with ``waitForSuccess`` a node whose
preparation failed after its retries gets no task of the job."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.batch_emulator.containers import run_task_process
from tests.batch_emulator.node import Node
from tests.batch_emulator.tasks import env_settings, job_task_env, task_folders, user_of

if TYPE_CHECKING:
    from tests.batch_emulator.cluster import Cluster


class JobPreparation:
    """The job's ``jobPreparationTask`` (``task``: None when the job has none) and each node's
    last exit code of it (``exits``)."""

    def __init__(self, cluster: Cluster, job: dict[str, Any]) -> None:
        self.cluster, self.job = cluster, job
        self.task: dict[str, Any] | None = job.get("jobPreparationTask")
        self.exits: dict[int, int | None] = {}
        self._prepared: set[tuple[int, int, int]] = set()  # the nodes' boots that ran it

    def folder(self, node: Node) -> Path | None:
        if self.task is None:
            return None
        return node.job_dir(self.job["id"]) / self.task.get("id", "jobpreparation")

    def output(self, node: Node) -> str:
        """What it wrote on ``node`` (stdout.txt, stderr.txt)."""
        folder = self.folder(node)
        return "".join(p.read_text() for p in sorted(folder.glob("*.txt"))) if folder else ""

    def failed(self) -> set[int]:
        """The nodes that get no task of the job: their preparation failed, and it waits."""
        if self.task is None or self.task.get("waitForSuccess") is False:
            return set()
        return {i for i, code in self.exits.items() if code not in (None, 0)}

    def ready(self, nodes: list[Node]) -> bool:
        """Runs it, concurrently, on each of ``nodes`` whose current boot has not run it yet;
        whether the try may start there (all prepared, or the job does not wait for it)."""
        prep = self.task
        if prep is None:
            return True
        # JobPreparationTask.rerunOnNodeRebootAfterSuccess (default true): it runs again
        # after a reboot, and "is always rerun if a Compute Node is reimaged", as a
        # preempted Spot node is (batch-spot-vms.md; both read 2026-11-28).
        again = bool(prep.get("rerunOnNodeRebootAfterSuccess", True))

        def boot(n: Node) -> tuple[int, int, int]:
            return (n.index, n.reimages, n.reboots if again else 0)

        todo = [n for n in nodes if boot(n) not in self._prepared]
        threads = [threading.Thread(target=self._run_on, args=(n, prep)) for n in todo]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for node in todo:
            if self.exits.get(node.index) == 0:
                self._prepared.add(boot(node))
        return all(boot(n) in self._prepared for n in nodes) or prep.get("waitForSuccess") is False

    def _run_on(self, node: Node, prep: dict[str, Any]) -> None:
        """Its tries on ``node``, until one exits 0 or its retries are spent."""
        task_dir = node.job_dir(self.job["id"]) / prep.get("id", "jobpreparation")
        task_folders(task_dir, user_of(prep.get("userIdentity")))
        task_id = prep.get("id", "jobpreparation")
        env = {
            **job_task_env(self.cluster.pool, node, self.job["id"], task_id, task_dir),
            **env_settings(prep),
        }
        retries = int((prep.get("constraints") or {}).get("maxTaskRetryCount") or 0)
        for attempt in range(retries + 1):
            name = f"prep-n{node.index}-try{attempt}"
            proc = run_task_process(
                self.cluster, node, name, prep, prep["commandLine"], task_dir, None, env,
                task_dir, False,
            )  # fmt: skip
            code = proc.wait(300)
            proc.kill()
            self.exits[node.index] = code
            self.cluster.log(f"node {node.index}: job preparation try {attempt} exited {code}")
            if code == 0:
                return
