"""The emulated pool as the Batch data plane shows it to ``dt-jobs``: the fake Batch server
(``tests.support.fake_batch``) answering from one ``JobRun`` of the emulator, so operator
commands (``dt-jobs logs``) run with the real SDK against what the emulated nodes wrote (the
task's state, its subtasks and every node's task files, read again at each request); and the
node-scheduling calls of ``dt-jobs keep-out`` (``NodeScheduling``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.batch_emulator.cluster import Cluster
from tests.batch_emulator.job_run import JobRun
from tests.batch_emulator.node import Node
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


class NodeScheduling:
    """The Batch client's node-scheduling calls (``get_node``, ``disable_node_scheduling``,
    ``enable_node_scheduling`` of azure-batch 15) as the emulated account answers them, for the
    operator's ``dt-jobs keep-out``. Disabling a node whose scheduling is already disabled is
    refused, as the REST reference says ("only if its current scheduling state is enabled")."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def _node(self, pool_id: str, node_id: str) -> Node:
        found = [n for n in self.cluster.nodes if n.id == node_id]
        if pool_id != self.cluster.pool.pool_id or not found:
            raise LookupError(f"NodeNotFound: {pool_id}/{node_id}")
        return found[0]

    def get_node(self, pool_id: str, node_id: str) -> Any:
        return SimpleNamespace(scheduling_state=self._node(pool_id, node_id).scheduling)

    def disable_node_scheduling(self, pool_id: str, node_id: str, options: Any = None) -> None:
        node = self._node(pool_id, node_id)
        if node.scheduling != "enabled":
            raise RuntimeError(f"node {node_id}: scheduling is already disabled")
        node.scheduling = "disabled"
        self.cluster.log(f"node {node.index}: scheduling disabled ({options})")

    def enable_node_scheduling(self, pool_id: str, node_id: str) -> None:
        self._node(pool_id, node_id).scheduling = "enabled"
