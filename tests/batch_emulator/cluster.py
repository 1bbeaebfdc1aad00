"""An emulated Batch pool that runs the payloads ``infra`` produces, on emulated nodes.

Inputs are what Batch receives: the pool as declared (``declared.PoolSpec``) and the job and task
as REST JSON (``job_options(spec).as_dict()``, ``task_options(spec).as_dict()``). Each node is a
network namespace of the VNet (``vnet.py``) with its own Batch folder tree, hardware
(``hardware.py``), instance metadata service and storage route; each process tree is a PID and
mount namespace whose PID 1 is ``agent.py``. The pool boots (each node's start task), takes jobs
(``job_run.JobRun``) and lives under the platform (``vm_events.py``). The rules cite the Batch
documentation they implement (paths are in MicrosoftDocs/azure-docs, ``articles/batch/``)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.batch_emulator import AGENT
from tests.batch_emulator.containers import SHARED_READINGS
from tests.batch_emulator.declared import NfsExport, PoolSpec
from tests.batch_emulator.hardware import make_node
from tests.batch_emulator.image import ImageConfig, PayloadError
from tests.batch_emulator.job_run import JobRun
from tests.batch_emulator.nfs_view import NFS_VIEW_SECONDS, NfsViews
from tests.batch_emulator.node import Node
from tests.batch_emulator.nvme import NvmeDisks
from tests.batch_emulator.placement import PLACEMENTS
from tests.batch_emulator.processes import ClusterClosed, Proc
from tests.batch_emulator.start_task import prefetch_failed, run_start_task
from tests.batch_emulator.storage import Storage
from tests.batch_emulator.tasks import BATCH_PORT, ROOT
from tests.batch_emulator.vm_events import GUEST_RESTART_READINGS, VmEvents
from tests.batch_emulator.vnet import IMDS_IP, VNet
from tests.support.fake_batch import COORDINATION_OUTPUTS
from tests.support.ports import free_port

TENANT = "00000000-0000-0000-0000-0000000000aa"
# Scheduled Events (articles/virtual-machines/linux/scheduled-events.md): the first request on a
# VM may be answered "up to two minutes" late; here a few seconds, more than the two seconds the
# launcher's watcher once waited before it gave up for good.
IMDS_FIRST_CALL_SECONDS = 3.0


def _check_readings(
    lifecycle: str, shared: str, placement: str, guest_restart: str, coordination_output: str
) -> None:
    """Each option of a reading where Azure is silent names one of its readings."""
    if lifecycle not in ("kill", "survive"):
        raise ValueError(f"lifecycle={lifecycle}")
    if shared not in SHARED_READINGS:
        raise ValueError(f"shared={shared!r}: one of {SHARED_READINGS}")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r}: one of {PLACEMENTS}")
    if guest_restart not in GUEST_RESTART_READINGS:
        raise ValueError(f"guest_restart={guest_restart!r}: one of {GUEST_RESTART_READINGS}")
    if coordination_output not in COORDINATION_OUTPUTS:
        raise ValueError(f"coordination_output: one of {COORDINATION_OUTPUTS}")


def _new_nodes(base: Path, vnet: VNet, pool: PoolSpec, count: int) -> list[Node]:
    return [
        Node(
            index=i,
            ip=vnet.node_ips[i],
            ns=vnet.node_ns(i) if vnet.isolated else None,
            root=base / "nodes" / f"n{i}",
            hw=base / "hw" / f"n{i}",
            ib_ports={
                **{f"mlx5_ib{k}": ("4: ACTIVE", "InfiniBand") for k in range(pool.ib_ports)},
                # The accelerated-networking NIC is an mlx5 device too, on Ethernet.
                "mlx5_an0": ("4: ACTIVE", "Ethernet"),
            },
            # A pool that asks for Spot nodes gets them after its dedicated ones.
            spot=bool(pool.spot_nodes) and i >= pool.dedicated_nodes,
        )
        for i in range(count)
    ]


class Cluster:
    """A pool of ``len(vnet.node_ips)`` emulated nodes (or ``nodes``); ``boot()`` runs the
    start task. The keyword options pick a reading where Azure is silent (README.md)."""

    def __init__(
        self,
        base: Path,
        vnet: VNet,
        pool: PoolSpec,
        image: ImageConfig,
        nfs: NfsExport,
        storage: Storage,
        identities: dict[str, str],
        *,
        lifecycle: str = "kill",
        nodes: int | None = None,
        driver: str = "580.95.05",
        imds_first_call: float = IMDS_FIRST_CALL_SECONDS,
        nfs_view: tuple[int, float] | None = (0, NFS_VIEW_SECONDS),
        shared: str = "node",
        placement: str = "same",
        guest_restart: str = "recovery",
        coordination_output: str = "apart",
        image_root: Path | None = None,
        registry_images: tuple[str, ...] = (),
    ) -> None:
        _check_readings(lifecycle, shared, placement, guest_restart, coordination_output)
        self.shared = shared  # the reading of the "Shared" bind mount (SHARED_READINGS)
        self.placement = placement  # where a retry runs (placement.py)
        self.guest_restart = guest_restart
        # Where the primary's coordination output goes (tests/support/fake_batch.py,
        # COORDINATION_OUTPUTS: Batch does not document it).
        self.coordination_output = coordination_output
        self.base, self.vnet, self.pool, self.image = base, vnet, pool, image
        self.nfs, self.storage, self.identities = nfs, storage, identities
        self.lifecycle = lifecycle
        # The built trainer image's root file system (tests/support/built_image.py): its
        # containers run in it; None: in this checkout's venv and trainer/, laid out as the
        # image lays them out (containers.py).
        self.image_root = image_root
        # What the registry holds: a node pulls the pool's containerImageNames as it joins.
        self.registry_images = registry_images
        self.driver = driver
        self.processes: list[Proc] = []
        self.helpers: list[subprocess.Popen[bytes]] = []
        self.events: list[str] = []
        self._lock = threading.Lock()
        self.imds_first_call = imds_first_call
        self.runs: list[JobRun] = []
        self._closed = False  # set by close(): from then on nothing more is started
        (base / "specs").mkdir(parents=True, exist_ok=True)
        (base / "logs").mkdir(parents=True, exist_ok=True)
        self.platform = VmEvents(self, base / "specs", base / "logs")
        self.nfs_export = base / "nfs-export"
        # (seed, bound) of the nodes' views of the share; None: every node sees the export.
        self.nfs_view = nfs_view
        self.nfs_views: NfsViews | None = None
        count = len(vnet.node_ips) if nodes is None else nodes
        self.nodes = _new_nodes(base, vnet, pool, count)

    def log(self, message: str) -> None:
        with self._lock:
            self.events.append(f"{time.monotonic():.2f} {message}")

    # --- the nodes join the pool ---
    def _make_nfs_export(self) -> None:
        """The server's export: owners and modes from its cloud-init; clients see them as is
        (NFSv4 with sec=sys passes numeric ids)."""
        self.nfs.create(self.nfs_export)
        if self.pool.nfs_relative_mount and self.nfs_view is not None:
            seed, bound = self.nfs_view
            views = self.base / "nfs-views"
            self.nfs_views = NfsViews(self.nfs_export, views, len(self.nodes), seed, bound)
            self.nfs_views.start()

    def sync_nfs(self) -> None:
        """What the nodes wrote on the share, on the server now (before a test reads it)."""
        if self.nfs_views is not None:
            self.nfs_views.push()

    def boot(self) -> None:
        """Nodes join the pool: folders, IMDS, then the start task on each, concurrently."""
        self._make_nfs_export()
        threads = []
        for node in self.nodes:
            make_node(node, self.pool, self.driver, self.nodes)
            self._start_imds(node)
            if prefetch_failed(self, node):
                continue
            threads.append(threading.Thread(target=run_start_task, args=(self, node)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.platform.start()

    def nvme(self, node: Node) -> NvmeDisks:
        """The node's local NVMe disks (none on a size without them)."""
        return NvmeDisks(node.hw, self.pool.nvme_disks)

    # --- the platform (vm_events.py) ---
    def schedule_event(self, kind: str, vm_names: list[str], notice: float) -> str:
        """See ``VmEvents.schedule_event``."""
        return self.platform.schedule_event(kind, vm_names, notice)

    def approved(self) -> list[tuple[str, str]]:
        """(VM, event id) of every approval the nodes sent."""
        return self.platform.approved()

    def _take(self, node: Node, kind: str, recovery: bool = True) -> None:
        """The platform takes the node's VM now (``VmEvents.take``)."""
        self.platform.take(node, kind, recovery)

    def _start_imds(self, node: Node) -> None:
        config = self.base / "specs" / f"imds-n{node.index}.json"
        host, port = (IMDS_IP, 80) if self.vnet.isolated else ("127.0.0.1", free_port())
        node.imds_endpoint = f"http://{host}:{port}"
        config.write_text(
            json.dumps(
                {
                    "host": host,
                    "port": port,
                    "identities": self.identities,
                    "tenant": TENANT,
                    "log": str(self.base / "logs" / f"imds-n{node.index}.log"),
                    "vm_name": node.vm_name,
                    "events": str(self.platform.scheduled_events),
                    "approvals": str(self.platform.approvals),
                    "first_call_delay": self.imds_first_call,
                }
            )
        )
        self._helper(node, "imds", str(config))

    def _helper(self, node: Node, *args: str) -> subprocess.Popen[bytes]:
        popen = subprocess.Popen(
            [*self.vnet.exec_prefix(node.ns), sys.executable, str(AGENT), *args],
            stdout=subprocess.PIPE,
            stderr=open(self.base / "logs" / f"{args[0]}-n{node.index}.err", "ab"),  # noqa: SIM115
        )
        assert popen.stdout is not None
        if popen.stdout.readline().strip() != b"ready":
            popen.kill()
            popen.wait()
            log = (self.base / "logs" / f"{args[0]}-n{node.index}.err").read_text()
            raise RuntimeError(f"agent {args} on node {node.index} did not start: {log[-500:]}")
        self._register(popen, self.helpers, f"agent {args[0]} on node {node.index}")
        return popen

    def _register(self, started: Any, kept: list[Any], name: str) -> None:
        """Keeps ``started`` in ``kept`` for close(); one started after close() (by a thread
        of a run or a rejoining node still going) is killed at once instead, so nothing
        outlives the cluster in the session's node namespaces."""
        with self._lock:
            closed = self._closed
            if not closed:
                kept.append(started)
        if closed:
            started.kill()
            started.wait()
            raise ClusterClosed(f"{name}: not started, the cluster is closed")

    # --- running processes -----------------------------------------------------------------------
    def spawn(
        self,
        node: Node,
        name: str,
        *,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        user: tuple[int, int],
        stdout: Path,
        stderr: Path,
        mounts: list[dict[str, Any]],
        rlimits: dict[str, tuple[int, int]] | None = None,
        keep_alive: bool = False,
        new_ipc: bool = False,
        new_net: bool = False,
    ) -> Proc:
        read_fd, write_fd = os.pipe()
        # Root on a node reaches a root-squashing export as an unprivileged user.
        squash = user == ROOT and bool(self.pool.nfs_relative_mount) and self.nfs.root_squash
        spec = {
            "argv": argv,
            "env": env,
            "cwd": str(cwd),
            "uid": user[0],
            "gid": user[1],
            "stdout": str(stdout),
            "stderr": str(stderr),
            "mounts": mounts,
            "rlimits": rlimits or {},
            "keep_alive": keep_alive,
            "squash_root": squash,
            "hostname": node.hostname,
            "status_fd": write_fd,
        }
        spec_path = self.base / "specs" / f"{name}.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        command = [*self.vnet.exec_prefix(node.ns), "unshare", "--pid", "--fork", "--kill-child",
                   "--mount-proc", "--uts"]  # fmt: skip
        if new_ipc:
            command.append("--ipc")
        if new_net:
            command.append("--net")
        command += [sys.executable, str(AGENT), "run", str(spec_path)]
        popen = subprocess.Popen(
            command,
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            stdout=open(self.base / "logs" / f"{name}.agent", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: Proc.kill kills it whole
        )
        os.close(write_fd)
        proc = Proc(popen, read_fd, name)
        self._register(proc, self.processes, f"{name} on node {node.index}")
        self.log(f"node {node.index}: started {name}: {shlex.join(argv)[:300]}")
        return proc

    def hold_batch_port(self, node: Node) -> subprocess.Popen[bytes]:
        return self._helper(node, "hold", "0.0.0.0", str(BATCH_PORT))

    # --- jobs ------------------------------------------------------------------------------------
    def submit(self, job: dict[str, Any], task: dict[str, Any]) -> JobRun:
        if job["poolInfo"]["poolId"] != self.pool.pool_id:
            raise PayloadError(f"job pool {job['poolInfo']['poolId']} is not {self.pool.pool_id}")
        run = JobRun(self, job, task)
        self.runs.append(run)
        run.start()
        return run

    def close(self) -> None:
        """Ends every run (a test that failed half-way leaves one going), then kills what the
        cluster started; its node namespaces belong to the session and must be left empty."""
        self.platform.stopped.set()
        for run in self.runs:
            run.terminate("kill")
        with self._lock:
            self._closed = True
            processes = list(self.processes)
        for proc in processes:
            proc.kill()
        for run in self.runs:
            run.join(timeout=30)
        for helper in self.helpers:
            with contextlib.suppress(ProcessLookupError):
                helper.kill()
            helper.wait()
        if self.nfs_views is not None:
            self.nfs_views.stop()
