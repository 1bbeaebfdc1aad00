"""An emulated job as the Batch data plane shows it to ``dt-jobs``: the fake Batch server
(``tests.support.fake_batch``) answering from one ``JobRun`` of the emulator, so operator
commands (``dt-jobs logs``) run with the real SDK against what the emulated nodes wrote: the
task's state, its subtasks and every node's task files, read again at each request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.infra.batch_nodes.batch import Cluster, JobRun
from tests.support.fake_batch import FakeBatch, Request


class EmulatedBatchApi(FakeBatch):
    """``FakeBatch`` whose job, task, placement and node files are those of ``run``."""

    def __init__(self, folder: Path, cluster: Cluster, run: JobRun) -> None:
        self.cluster, self.run = cluster, run
        super().__init__(folder, coordination_output=cluster.coordination_output)
        self.faults.append(self._mirror)  # before each answer: the run as it is now

    def task_root(self, job_id: str, task_id: str, instance: int) -> str:  # type: ignore[override]
        """Where the emulator keeps an instance's files, under its node's root (each node's
        task folder has the same relative path, as on Batch: batch-mpi.md)."""
        node = self._nodes()[instance]
        return str(self.run.task_dir(node).relative_to(node.root))

    def _nodes(self) -> list[Any]:
        """The try's nodes, the primary (the master) first, as List Subtasks numbers them."""
        master = self.run.master
        return [master, *(n for n in self.run.nodes if n is not master)] if master else []

    def _mirror(self, request: Request, fake: FakeBatch) -> None:
        job_id, task = self.run.job["id"], self.run.task
        self.jobs.setdefault(job_id, {"id": job_id, "state": "active"})
        self.tasks[job_id] = [task]
        state = self.run.state
        self.task_state = state
        self.task_retries = self.run.retry_count
        pool = self.cluster.pool.pool_id
        nodes = self._nodes()
        if state not in ("running", "completed") or not nodes:
            self.placements.pop((job_id, task["id"]), None)
            return None
        self.placements[(job_id, task["id"])] = [n.id for n in nodes]
        self.task_pools[(job_id, task["id"])] = pool
        self.pool_nodes[pool] = [
            {"id": n.id, "state": "running", "schedulingState": n.scheduling} for n in nodes
        ]
        for instance, node in enumerate(nodes):
            root = self.task_root(job_id, task["id"], instance)
            folder = node.root / root
            self.node_files[node.id] = {
                f"{root}/{path.name}": bytearray(path.read_bytes())
                for path in sorted(folder.glob("*.txt"))
                if path.is_file()
            }
        return None
