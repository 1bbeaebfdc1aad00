"""An emulated Batch pool that runs the payloads ``infra`` produces, on emulated nodes.

Inputs are what Batch receives: the pool as declared (``azure-native:batch:Pool`` inputs under
Pulumi mocks) and the job and task as REST JSON (``job_options(spec).as_dict()``,
``task_options(spec).as_dict()``). Each node is a network namespace
(``tests.infra.batch_nodes.fabric``) with its own Batch folder tree, hardware (a fake
``/sys/class/infiniband``, a stub ``nvidia-smi``), instance metadata service and storage route; each
task process tree is a PID and mount namespace started by ``tests/infra/batch_nodes/agent.py``. The
emulated platform lists the pool's Scheduled Events on every node and starts them (at NotBefore, or
soon after an approval): the VMs they name are taken, and a task that was running there is requeued,
not retried. The rules below cite the Batch documentation they implement (paths are in
MicrosoftDocs/azure-docs, ``articles/batch/``).
"""

from __future__ import annotations

import contextlib
import email.utils
import glob
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.infra.batch_nodes.fabric import IMDS_IP, Fabric
from tests.infra.batch_nodes.image import (
    DEFAULT_PATH,
    NVIDIA_ENTRYPOINT,
    ImageConfig,
    PayloadError,
    batch_create_args,
    container_argv,
    docker_create_options,
)
from tests.infra.batch_nodes.nfs_view import NfsViews
from tests.infra.batch_nodes.nvme import NvmeDisks
from tests.infra.batch_nodes.placement import PLACEMENTS, place
from tests.support.fake_batch import COORDINATION_OUTPUTS, COORDINATION_PREFIX
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[3]
AGENT = Path(__file__).with_name("agent.py")
# The pool-scope auto-user. Batch does not document its uid; any non-root uid that the image
# does not know (the image's own user is 1000) is the strict case: no HOME of its own.
TASK_USER = (1001, 1001)
ROOT = (0, 0)
# The port in AZ_BATCH_MASTER_NODE; batch-compute-node-environment-variables.md gives
# `10.0.0.4:6000` as the example and reserves that port for Batch.
BATCH_PORT = 6000
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
# Which folder a container's "Shared" bind mount is. ContainerHostDataPath.Shared is only "The
# path for multi-instances task to shared their files" (Batch REST reference; the SDKs' enum
# says the same), so both readings run: "node", the node's shared folder
# (AZ_BATCH_NODE_SHARED_DIR, batch-compute-node-environment-variables.md), or "task", the task's
# own shared folder (AZ_BATCH_TASK_SHARED_DIR of a multi-instance task; for another task, its
# own folder), under which AZ_BATCH_NODE_SHARED_DIR is not in the container at all.
SHARED_READINGS = ("node", "task")
# What a restart from inside the VM (systemctl reboot) does to the task running there. Batch
# "will retry Tasks when a recovery operation is triggered on a Node ... when an unhealthy Node
# is rebooted ... not counted against the maxTaskRetryCount" (BatchTask's remarks), but does not
# say whether a restart it did not order is one: "recovery", the task requeued without using a
# retry, or "failure", its processes die and the try fails as any other.
GUEST_RESTART_READINGS = ("recovery", "failure")
TENANT = "00000000-0000-0000-0000-0000000000aa"
# Scheduled Events (articles/virtual-machines/linux/scheduled-events.md): the first request on a
# VM may be answered "up to two minutes" late; here a few seconds, more than the two seconds the
# launcher's watcher once waited before it gave up for good.
IMDS_FIRST_CALL_SECONDS = 3.0
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


def _lower(value: Any) -> str:
    return str(value or "").lower()


# --- what infra declared ------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolSpec:
    pool_id: str
    vm_size: str
    gpus: int
    ib_ports: int  # InfiniBand HCAs (one port each) of the size
    gpu_name: str
    start_task: dict[str, Any]
    nfs_relative_mount: str | None
    task_slots_per_node: int
    inter_node_communication: bool
    identity_ids: tuple[str, ...]
    registries: tuple[str, ...]
    dedicated_nodes: int = 0  # nodes [0, dedicated) are dedicated, the rest Spot
    spot_nodes: int = 0
    nvme_disks: int = 0  # the size's local NVMe disks (tests/infra/batch_nodes/nvme.py)

    @classmethod
    def from_declared(cls, inputs: dict[str, Any]) -> PoolSpec:
        from infra import sizes

        size_of = getattr(sizes, "size_of", sizes.SUPPORTED.__getitem__)
        size = size_of(inputs["vmSize"])
        mounts = inputs.get("mountConfiguration") or []
        nfs = next(
            (m["nfsMountConfiguration"] for m in mounts if "nfsMountConfiguration" in m), None
        )
        identities = (inputs.get("identity") or {}).get("userAssignedIdentities") or {}
        vm = inputs["deploymentConfiguration"]["virtualMachineConfiguration"]
        registries = (vm.get("containerConfiguration") or {}).get("containerRegistries") or []
        return cls(
            pool_id=inputs.get("poolName") or inputs.get("id"),
            vm_size=inputs["vmSize"],
            dedicated_nodes=_asked_nodes(inputs, "Dedicated"),
            spot_nodes=_asked_nodes(inputs, "LowPriority"),
            gpus=size.gpus,
            ib_ports=getattr(size, "ib_ports", size.gpus),
            nvme_disks=getattr(size, "nvme_disks", 0),
            gpu_name="emulated GPU",  # only what nvidia-smi prints; nothing reads it
            start_task=inputs.get("startTask") or {},
            nfs_relative_mount=nfs["relativeMountPath"] if nfs else None,
            task_slots_per_node=int(inputs.get("taskSlotsPerNode") or 1),
            inter_node_communication=_lower(inputs.get("interNodeCommunication")) == "enabled",
            identity_ids=tuple(identities),
            registries=tuple(str(r.get("registryServer")) for r in registries),
        )


# Each node sees the share through its own incoherent view (tests/infra/batch_nodes/nfs_view.py,
# which cites nfs(5)): another node's new, replaced or removed entries reach it up to this many
# seconds late (a real client: up to acdirmax, a minute). Scaled down so tests stay short: every
# try waits out a few of these delays (the token, the outcomes), so most clusters take a short
# bound, which still leaves each wait seconds longer than the launchers' polls; one full run
# keeps the long one (NFS_VIEW_LONG_SECONDS).
NFS_VIEW_SECONDS = 3.0
NFS_VIEW_LONG_SECONDS = 10.0


# The NFS server's root as the emulated nodes' file system sees it: a uid and gid no node
# maps (see ``Cluster.spawn``), so node root cannot override its permissions.
SERVER_ROOT = 100000


@dataclass(frozen=True)
class NfsExport:
    """The NFS server's exported tree as its cloud-init leaves it: owner, group and mode of
    each folder the setup script makes or changes (relative to the export), and the export
    options of /etc/exports."""

    folders: tuple[tuple[str, int, int, int], ...]  # (relative path, uid, gid, mode)
    options: frozenset[str]

    @property
    def root_squash(self) -> bool:
        # exports(5): root_squash is the default; no_root_squash turns it off.
        return "no_root_squash" not in self.options

    @classmethod
    def from_cloud_init(cls, user_data: str, mount_point: str) -> NfsExport:
        import yaml

        document = yaml.safe_load(user_data)
        files = {f["path"]: f["content"] for f in document.get("write_files", [])}
        exports = [
            line.split()
            for line in files.get("/etc/exports", "").splitlines()
            if line.strip() and not line.startswith("#")
        ]
        entry = next((e for e in exports if e[0] == mount_point), None)
        if entry is None:
            raise PayloadError(f"/etc/exports does not export {mount_point}")
        options = frozenset(entry[1].split("(", 1)[1].rstrip(")").split(","))
        # A fresh ext4 file system's root is root:root 0755 (mke2fs); the setup scripts that
        # runcmd executes (as root, on the server) then change the tree.
        tree: dict[str, list[int]] = {"": [0, 0, 0o755]}
        scripts = [
            files[command[0]]
            for command in document.get("runcmd", [])
            if isinstance(command, list) and command and command[0] in files
        ]
        prefix = mount_point.rstrip("/")
        for script in scripts:
            for line in script.replace("\\\n", " ").splitlines():
                try:
                    words = shlex.split(line, comments=True)
                except ValueError:
                    continue
                args = [w for w in words[1:] if not w.startswith("-")]
                paths = [a for a in args if a == prefix or a.startswith(prefix + "/")]
                if not words or not paths:
                    continue
                for path in paths:
                    relative = path[len(prefix) :].strip("/")
                    if words[0] == "mkdir":
                        parts = relative.split("/") if relative else []
                        for depth in range(1, len(parts) + 1):
                            tree.setdefault("/".join(parts[:depth]), [0, 0, 0o755])
                    elif relative in tree and words[0] == "chmod":
                        tree[relative][2] = _chmod(tree[relative][2], args[0])
                    elif relative in tree and words[0] == "chown":
                        owner, _, group = args[0].partition(":")
                        tree[relative][0] = _id(owner, tree[relative][0])
                        tree[relative][1] = _id(group, tree[relative][1])
                    elif relative in tree and words[0] == "chgrp":
                        tree[relative][1] = _id(args[0], tree[relative][1])
        folders = tuple(sorted((path, *values) for path, values in tree.items()))
        return cls(folders, options)  # type: ignore[arg-type]

    def create(self, root: Path) -> None:
        """The tree under ``root``, owned as on the server (its root as ``SERVER_ROOT``)."""
        for relative, uid, gid, mode in self.folders:
            folder = root / relative if relative else root
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, uid or SERVER_ROOT, gid or SERVER_ROOT)
            os.chmod(folder, mode)


def _id(name: str, default: int) -> int:
    if not name:
        return default
    if name.isdigit():
        return int(name)
    return {"root": 0, "nobody": 65534, "nogroup": 65534}.get(name, default)


def _chmod(mode: int, spec: str) -> int:
    """chmod(1) modes: octal, or symbolic clauses like ``a+rwx,o-w`` and ``1777``."""
    if spec.isdigit():
        return int(spec, 8)
    bits = {"r": 4, "w": 2, "x": 1}
    shift = {"u": 6, "g": 3, "o": 0}
    for clause in spec.split(","):
        who = ""
        while clause and clause[0] in "ugoa":
            who, clause = who + clause[0], clause[1:]
        targets = "ugo" if who in ("", "a") or "a" in who else who
        operator, perms = clause[0], clause[1:]
        for target in targets:
            value = sum(bits[p] for p in perms if p in bits) << shift[target]
            if operator == "+":
                mode |= value
            elif operator == "-":
                mode &= ~value
            else:
                mode = (mode & ~(7 << shift[target])) | value
        if "t" in perms:
            mode = mode | 0o1000 if operator != "-" else mode & ~0o1000
    return mode


@dataclass(frozen=True)
class Storage:
    """The storage account as the nodes reach it (Azurite over HTTPS with token auth)."""

    blob_endpoint: str  # https://<ip>/<account>/ , what infra calls the blob endpoint
    ca_file: Path
    account: str
    key: str

    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=https;AccountName={self.account};AccountKey={self.key};"
            f"BlobEndpoint={self.blob_endpoint.rstrip('/')};"
        )


# --- processes on nodes -------------------------------------------------------------------------
class ClusterClosed(RuntimeError):
    """A process asked for after the cluster closed (see ``Cluster._register``)."""


class Proc:
    """A task's process tree in its own PID namespace (PID 1 is the agent)."""

    def __init__(self, popen: subprocess.Popen[bytes], status_fd: int, name: str) -> None:
        self.popen, self.name = popen, name
        self.code: int | None = None
        self.error: str | None = None
        self.done = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(status_fd,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            line = pipe.readline()
        if line:
            status = json.loads(line)
            self.code, self.error = status["exit"], status.get("error")
        else:  # the agent died before reporting (killed with its namespace)
            self.code = self.popen.wait()
            self.code = 128 - self.code if self.code < 0 else self.code
        self.done.set()

    def wait(self, timeout: float | None = None) -> int | None:
        self.done.wait(timeout)
        return self.code

    def init_pid(self) -> int | None:
        """The tree's PID 1 as this machine numbers it: the child of ``unshare``."""
        parent = str(self.popen.pid)
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if fields[1] == parent:
                    return int(entry)
        return None

    def pids(self) -> list[int]:
        """Every process of the tree except its PID 1 (the container's processes)."""
        init = self.init_pid()
        if init is None:
            return []
        try:
            namespace = os.readlink(f"/proc/{init}/ns/pid")
        except OSError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == init:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    found.append(int(entry))
        return found

    def main_pid(self) -> int | None:
        """The container's first process (what Docker starts and `docker stop` signals): the
        agent's oldest child; processes orphaned later are reparented to the agent too."""
        init = self.init_pid()
        if init is None:
            return None
        children = []
        for pid in self.pids():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == init:
                    children.append((int(fields[19]), pid))  # starttime, pid
        return min(children)[1] if children else None

    def stop_signal(self, signum: int) -> str:
        """``signum`` to the container's first process only, as `docker stop` sends it. That
        process is PID 1 of the container's PID namespace, and "a process running as PID 1
        inside a container ... ignores any signal with the default action" (docs.docker.com,
        docker run reference, --init; the kernel drops a signal to a namespace's init that has
        no handler for it). Here the agent is the namespace's init, so the rule is applied by
        hand: the signal is dropped unless the first process catches it. What happened, for
        the log."""
        pid = self.main_pid()
        if pid is None:
            return "no process"
        caught = 0
        with contextlib.suppress(OSError, StopIteration, ValueError):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            caught = int(next(line for line in status if line.startswith("SigCgt:")).split()[1], 16)
        if not caught & (1 << (signum - 1)):
            return f"dropped: PID 1 ({pid}) has no handler for signal {signum}"
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        return f"sent to PID 1 ({pid})"

    def kill(self) -> None:
        """The container is removed: its PID 1 dies and the kernel kills the rest."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
        self.popen.wait()
        self.done.wait(5)


# --- nodes ----------------------------------------------------------------------------------------
@dataclass
class Node:
    index: int
    ip: str
    ns: str | None
    root: Path  # AZ_BATCH_NODE_ROOT_DIR
    hw: Path  # this node's hardware and host files, outside the Batch tree
    state: str = "creating"
    start_task_exit: int | None = None
    ib_ports: dict[str, tuple[str, str]] = field(default_factory=dict)
    kernel_log: str = ""  # what dmesg prints on the node (the GPU driver's Xid messages)
    # SchedulingState: "disabled" after Compute Node - Disable Scheduling ("No new Tasks will be
    # scheduled on the Compute Node"; its running tasks finish with taskcompletion).
    scheduling: str = "enabled"
    units: list[Proc] = field(default_factory=list)  # what systemd runs for the start task
    spot: bool = False  # AZ_BATCH_NODE_IS_DEDICATED false; only a Spot node is preempted
    # A job's preparation runs again after a reimage (a preempted Spot node is one) and, with
    # rerunOnNodeRebootAfterSuccess, after a reboot.
    reimages: int = 0
    reboots: int = 0

    @property
    def id(self) -> str:
        return f"tvm-emulated_{self.index + 1}-20261122t000000z"

    @property
    def hostname(self) -> str:
        return f"batchnode{self.index}"

    @property
    def vm_name(self) -> str:
        """What the node's metadata service calls its VM (and Scheduled Events' Resources)."""
        return f"batchpoolvmss_{self.index}"

    @property
    def shared_dir(self) -> Path:
        return self.root / "shared"

    @property
    def kmsg(self) -> Path:
        """The kernel's log since boot (what dmesg prints on the node)."""
        return self.hw / "kmsg"

    @property
    def startup_dir(self) -> Path:
        return self.root / "startup"

    @property
    def mounts_dir(self) -> Path:
        return self.root / "fsmounts"

    def job_dir(self, job_id: str) -> Path:
        # batch-compute-node-environment-variables.md: a job's folder is workitems/{job}/job-1.
        return self.root / "workitems" / job_id / "job-1"


class Cluster:
    """A pool of ``len(fabric.node_ips)`` emulated nodes; ``boot()`` runs the start task."""

    def __init__(
        self,
        base: Path,
        fabric: Fabric,
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
    ) -> None:
        if lifecycle not in ("kill", "survive"):
            raise ValueError(f"lifecycle={lifecycle}")
        if shared not in SHARED_READINGS:
            raise ValueError(f"shared={shared!r}: one of {SHARED_READINGS}")
        self.shared = shared  # the reading of the "Shared" bind mount (SHARED_READINGS)
        if placement not in PLACEMENTS:
            raise ValueError(f"placement={placement!r}: one of {PLACEMENTS}")
        self.placement = placement  # where a retry runs (tests/infra/batch_nodes/placement.py)
        if guest_restart not in GUEST_RESTART_READINGS:
            raise ValueError(f"guest_restart={guest_restart!r}: one of {GUEST_RESTART_READINGS}")
        self.guest_restart = guest_restart
        if coordination_output not in COORDINATION_OUTPUTS:
            raise ValueError(f"coordination_output: one of {COORDINATION_OUTPUTS}")
        # Where the primary's coordination output goes (tests/support/fake_batch.py,
        # COORDINATION_OUTPUTS: Batch does not document it).
        self.coordination_output = coordination_output
        self.base, self.fabric, self.pool, self.image = base, fabric, pool, image
        self.nfs, self.storage, self.identities = nfs, storage, identities
        self.lifecycle = lifecycle
        self.driver = driver
        self.processes: list[Proc] = []
        self.helpers: list[subprocess.Popen[bytes]] = []
        self.events: list[str] = []
        self._lock = threading.Lock()
        self.imds_first_call = imds_first_call
        self.runs: list[JobRun] = []
        # The pool's Scheduled Events (one placement group: every node lists them all).
        self.scheduled_events = base / "specs" / "scheduled-events.json"
        self.approvals = base / "logs" / "scheduled-approvals.jsonl"
        self._scheduled: list[dict[str, Any]] = []
        self._due: dict[str, float] = {}  # event id -> when the platform starts it
        self._platform_stop = threading.Event()
        self._closed = False  # set by close(): from then on nothing more is started
        count = len(fabric.node_ips) if nodes is None else nodes
        (base / "specs").mkdir(parents=True, exist_ok=True)
        (base / "logs").mkdir(parents=True, exist_ok=True)
        self.nfs_export = base / "nfs-export"
        # (seed, bound) of the nodes' views of the share; None: every node sees the export.
        self.nfs_view = nfs_view
        self.nfs_views: NfsViews | None = None
        self.nodes = [
            Node(
                index=i,
                ip=fabric.node_ips[i],
                ns=fabric.node_ns(i) if fabric.isolated else None,
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

    def log(self, message: str) -> None:
        with self._lock:
            self.events.append(f"{time.monotonic():.2f} {message}")

    # --- node setup ------------------------------------------------------------------------------
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

    def _make_tree(self, node: Node) -> None:
        # files-and-directories.md: the Batch tree belongs to the agent (root); every task can
        # read and write the shared folder (batch-compute-node-environment-variables.md:
        # AZ_BATCH_NODE_SHARED_DIR "All tasks that execute on a node have read/write access").
        for folder in (node.root, node.startup_dir, node.mounts_dir, node.root / "workitems"):
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, 0o755)
        node.shared_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(node.shared_dir, 0o777)

    def _make_node(self, node: Node) -> None:
        self._make_tree(node)
        if self.pool.nfs_relative_mount:
            (node.mounts_dir / self.pool.nfs_relative_mount).mkdir(exist_ok=True)
        # Hardware: InfiniBand HCAs as sysfs shows them, and the GPUs as nvidia-smi lists them.
        sysfs = node.hw / "sys-infiniband"
        shutil.rmtree(sysfs, ignore_errors=True)
        for device, (state, link_layer) in node.ib_ports.items():
            port = sysfs / device / "ports" / "1"
            port.mkdir(parents=True)
            (port / "state").write_text(f"{state}\n")
            (port / "link_layer").write_text(f"{link_layer}\n")
            up = "ACTIVE" in state
            (port / "phys_state").write_text("5: LinkUp\n" if up else "3: Disabled\n")
            (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
        # The driver's tools: on the node, and in containers, where Batch enables the GPUs
        # (batch-docker-container-workloads.md) and NVIDIA's runtime puts them on PATH.
        (node.hw / "bin").mkdir(parents=True, exist_ok=True)
        smi = node.hw / "bin" / "nvidia-smi"
        smi.write_text(_nvidia_smi(self.pool.gpus, self.pool.gpu_name, self.driver))
        smi.chmod(0o755)
        # The kernel's log since boot, as the node's admin reads it with dmesg: a file, which a
        # test may add to while the node runs and a restart empties.
        node.kmsg.write_text(node.kernel_log)
        dmesg = node.hw / "bin" / "dmesg"
        dmesg.write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(node.kmsg))}\n")
        dmesg.chmod(0o755)
        # systemd, as far as the start task uses it: `systemd-run` records a transient unit,
        # which the emulator starts once the start task succeeded (Batch nodes run systemd; a
        # unit lives outside the start task's processes until the node restarts), and
        # `systemctl reboot` asks the platform to restart the VM.
        (node.hw / "units").mkdir(exist_ok=True)
        for tool in ("systemd-run", "systemctl"):
            stub = node.hw / "bin" / tool
            stub.write_text(_SYSTEMD_STUB.format(python=sys.executable, hw=str(node.hw)))
            stub.chmod(0o755)
        # The node's /var/lib, on its OS disk: it survives a restart.
        (node.hw / "var-lib").mkdir(exist_ok=True)
        # The node's own /mnt, where the start task mounts the NVMe array; the size's local NVMe
        # disks, blank on a new VM, and the tools that assemble them.
        (node.hw / "mnt").mkdir(exist_ok=True)
        if self.pool.nvme_disks:
            disks = self.nvme(node)
            disks.lose()
            disks.install(node.hw / "bin")
        # Each VM has its own hostname, which the VNet's DNS resolves to its private address.
        hosts = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        hosts += [f"{n.ip} {n.hostname}" for n in self.nodes]
        (node.hw / "hosts").write_text("\n".join(hosts) + "\n")
        opt_microsoft = node.hw / "opt-microsoft"  # the HPC image's NCCL topology files
        opt_microsoft.mkdir(parents=True, exist_ok=True)
        for name in ("ndv4-topo.xml", "ndv5-topo.xml", "ndv4/topo.xml", "ndv5/topo.xml"):
            (opt_microsoft / name).parent.mkdir(exist_ok=True)
            (opt_microsoft / name).write_text("<system version='1'></system>\n")
        for path in (node.hw, *node.hw.rglob("*")):
            if path.is_dir():
                os.chmod(path, 0o755)
        for path in sysfs.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o444)
        os.chmod(sysfs, 0o755)

    def _node_mounts(self, node: Node, stage: Path) -> list[dict[str, Any]]:
        """What every process on the node sees: its /etc/hosts; the NFS share where the pool
        mounts it (NFSMountConfiguration.relativeMountPath: "All file systems are mounted
        relative to the Batch mounts directory, accessible via the AZ_BATCH_NODE_MOUNTS_DIR
        environment variable"; virtual-file-mount.md: mounted "when a compute node joins the
        pool", so before the start task); its InfiniBand devices in /sys/class/infiniband."""
        ops: list[dict[str, Any]] = [
            {"op": "bind", "src": str(node.hw / "hosts"), "dst": "/etc/hosts", "ro": True}
        ]
        if self.pool.nfs_relative_mount:
            target = node.mounts_dir / self.pool.nfs_relative_mount
            share = self.nfs_export if self.nfs_views is None else self.nfs_views.path(node.index)
            ops.append({"op": "bind", "src": str(share), "dst": str(target)})
        ops.append(
            {
                "op": "sys_class",
                "stage": str(stage / "sys"),
                "entries": {"infiniband": str(node.hw / "sys-infiniband")},
            }
        )
        return ops

    def boot(self) -> None:
        """Nodes join the pool: folders, IMDS, then the start task on each, concurrently."""
        self._make_nfs_export()
        threads = []
        for node in self.nodes:
            self._make_node(node)
            self._start_imds(node)
            threads.append(threading.Thread(target=self._run_start_task, args=(node,)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._write_scheduled()
        threading.Thread(target=self._platform, name="platform", daemon=True).start()

    # --- the platform: Scheduled Events and what they do to nodes -------------------------------
    def schedule_event(self, kind: str, vm_names: list[str], notice: float) -> str:
        """An event for ``vm_names`` (the pool's or others: events reach the whole placement
        group), which the platform starts ``notice`` seconds from now or soon after a VM
        approves it; returns its id. Azure preempts only Spot nodes ("The Spot Virtual Machine
        is being deleted", scheduled-events.md, read 2026-11-28)."""
        mine = {n.vm_name: n for n in self.nodes}
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
        self._write_scheduled()
        self.log(f"scheduled event {event_id}: {kind} {vm_names} not before {not_before}")
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

    def _write_scheduled(self) -> None:
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
        while not self._platform_stop.wait(0.2):
            for node in self.nodes:
                restart = node.hw / "reboot-requested"
                if restart.exists():
                    restart.unlink()
                    recovery = self.guest_restart == "recovery"
                    self._take(node, "a restart from the node itself", recovery)
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
            self._write_scheduled()
            for event in due:
                self.log(f"platform starts {event['EventId']}: {event['EventType']}")
                for node in self.nodes:
                    if node.vm_name in event["Resources"] and event["EventType"] != "Freeze":
                        self._take(node, event["EventType"])

    def _take(self, node: Node, kind: str, recovery: bool = True) -> None:
        """The VM goes away (preempted, rebooted, redeployed, deleted): every process on it
        dies with it; the node comes back after REJOIN_SECONDS and runs the start task. Unless
        ``recovery``, its tasks' processes just die: the tries fail as any other."""
        node.state = "preempted" if kind == "Preempt" else "rebooting"
        self.log(f"node {node.index}: taken by {kind}")
        for run in list(self.runs):
            run.node_lost(node, recovery)
        for unit in node.units:
            unit.kill()
        node.units.clear()
        node.kmsg.write_text("")  # a new boot, a new kernel log
        if kind in DISK_LOST:
            node.reimages += 1
            self._reinitialize(node)
        else:
            node.reboots += 1
        if self.pool.nvme_disks:
            # The local NVMe disks go with the VM as the temporary disk does; a restart keeps
            # them, and the kernel assembles what it finds on them again (nvme.py).
            disks = self.nvme(node)
            disks.lose() if kind in DISK_LOST else disks.boot()

        def rejoin() -> None:
            if self._platform_stop.wait(REJOIN_SECONDS):  # a closed cluster boots nothing
                return
            with contextlib.suppress(ClusterClosed):  # closed while it booted
                self._run_start_task(node)

        threading.Thread(target=rejoin, daemon=True).start()

    def _reinitialize(self, node: Node) -> None:
        """Empties what the VM held on its own disks: the Batch tree but its mount points."""
        for entry in list(node.root.iterdir()):
            if entry == node.mounts_dir:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        self._make_tree(node)

    def _start_imds(self, node: Node) -> None:
        config = self.base / "specs" / f"imds-n{node.index}.json"
        host, port = (IMDS_IP, 80) if self.fabric.isolated else ("127.0.0.1", free_port())
        node.imds_endpoint = f"http://{host}:{port}"  # type: ignore[attr-defined]
        config.write_text(
            json.dumps(
                {
                    "host": host,
                    "port": port,
                    "identities": self.identities,
                    "tenant": TENANT,
                    "log": str(self.base / "logs" / f"imds-n{node.index}.log"),
                    "vm_name": node.vm_name,
                    "events": str(self.scheduled_events),
                    "approvals": str(self.approvals),
                    "first_call_delay": self.imds_first_call,
                }
            )
        )
        self._helper(node, "imds", str(config))

    def _helper(self, node: Node, *args: str) -> subprocess.Popen[bytes]:
        popen = subprocess.Popen(
            [*self.fabric.exec_prefix(node.ns), sys.executable, str(AGENT), *args],
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
        command = [*self.fabric.exec_prefix(node.ns), "unshare", "--pid", "--fork", "--kill-child",
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
        )
        os.close(write_fd)
        proc = Proc(popen, read_fd, name)
        self._register(proc, self.processes, f"{name} on node {node.index}")
        self.log(f"node {node.index}: started {name}: {shlex.join(argv)[:300]}")
        return proc

    def _base_env(self, node: Node) -> dict[str, str]:
        """batch-compute-node-environment-variables.md, variables for "All tasks"."""
        return {
            "AZ_BATCH_ACCOUNT_NAME": "emulated",
            "AZ_BATCH_ACCOUNT_URL": "https://emulated.eastus.batch.azure.com",
            "AZ_BATCH_POOL_ID": self.pool.pool_id,
            "AZ_BATCH_NODE_ID": node.id,
            "AZ_BATCH_NODE_IS_DEDICATED": "false" if node.spot else "true",
            "AZ_BATCH_NODE_ROOT_DIR": str(node.root),
            "AZ_BATCH_NODE_SHARED_DIR": str(node.shared_dir),
            "AZ_BATCH_NODE_STARTUP_DIR": str(node.startup_dir),
            "AZ_BATCH_NODE_MOUNTS_DIR": str(node.mounts_dir),
            "AZ_BATCH_TASK_RESERVED_EPHEMERAL_DISK_SPACE_BYTES": "1000000",
        }

    # --- the start task --------------------------------------------------------------------------
    def _run_start_task(self, node: Node) -> None:
        """The pool's start task, on the node itself (not in a container: it has no container
        settings), as its user identity. With waitForSuccess a node whose start task still
        fails after maxTaskRetryCount retries is unusable and gets no task (BatchStartTask
        waitForSuccess: "the Batch service marks the Node unusable, and will not schedule
        Tasks to it"; the node state is starttaskfailed)."""
        task = self.pool.start_task
        if not task:
            node.state = "idle"
            return
        retries = int(task.get("maxTaskRetryCount") or 0)
        user = _user_of(task.get("userIdentity"))
        task_dir = node.startup_dir
        workdir = task_dir / "wd"
        workdir.mkdir(parents=True, exist_ok=True)
        os.chown(workdir, *user)
        # The start task's waits (InfiniBand ports still INIT after boot: infra/cluster.py) run
        # on a clock of their own that passes at once: an emulated port is up or down from the
        # start, whatever the time, so only the wall-clock cost of the wait is left out.
        clock = node.hw / "start-task-clock"
        clock.mkdir(exist_ok=True)
        (clock / "sleep").write_text("#!/bin/sh\nexit 0\n")
        (clock / "sleep").chmod(0o755)
        env = {
            **self._base_env(node),
            "AZ_BATCH_TASK_DIR": str(task_dir),
            "AZ_BATCH_TASK_WORKING_DIR": str(workdir),
            "PATH": f"{clock}:{node.hw / 'bin'}:{DEFAULT_PATH}",
            "HOME": "/root" if user[0] == 0 else str(workdir),
            **_env_settings(task),
        }
        stage = self.base / "stage" / f"start-n{node.index}"
        stage.mkdir(parents=True, exist_ok=True)
        mounts = self._admin_mounts(node, stage)
        node.state = "starting"
        try:
            argv = _command_argv(task["commandLine"])
        except PayloadError as error:
            # The process never starts: the start task fails on every try.
            (task_dir / "stderr.txt").write_text(f"emulated Batch: {error}\n")
            self.log(f"node {node.index}: start task cannot start: {error}")
            node.state = "starttaskfailed"
            return
        for attempt in range(retries + 1):
            proc = self.spawn(
                node,
                f"start-n{node.index}-try{attempt}",
                argv=argv,
                env=env,
                cwd=workdir,
                user=user,
                stdout=task_dir / "stdout.txt",
                stderr=task_dir / "stderr.txt",
                mounts=mounts,
            )
            code = proc.wait(120)
            proc.kill()
            node.start_task_exit = code
            self.log(f"node {node.index}: start task try {attempt} exited {code}")
            if code == 0:
                self._start_units(node, mounts)
                node.state = "idle"
                return
        wait = task.get("waitForSuccess")
        node.state = "starttaskfailed" if wait is None or wait else "idle"

    def _admin_mounts(self, node: Node, stage: Path) -> list[dict[str, Any]]:
        """What the node's own processes (the start task, systemd's units) see: the node's
        mounts, its /var/lib and its /mnt, with what is mounted under it in this boot."""
        var_lib = {"op": "bind", "src": str(node.hw / "var-lib"), "dst": "/var/lib"}
        return [*self._node_mounts(node, stage), var_lib, *self._mnt(node)]

    def nvme(self, node: Node) -> NvmeDisks:
        """The node's local NVMe disks (none on a size without them)."""
        return NvmeDisks(node.hw, self.pool.nvme_disks)

    def _mnt(self, node: Node) -> list[dict[str, Any]]:
        """The node's /mnt, and the file systems the node mounted under it since it booted."""
        ops: list[dict[str, Any]] = [{"op": "bind", "src": str(node.hw / "mnt"), "dst": "/mnt"}]
        if not self.pool.nvme_disks:
            return ops
        for point in json.loads((self.nvme(node).root / "mounts.json").read_text()):
            data = self.nvme(node).mounted(point)
            ops += [{"op": "mkdir", "dst": point}, {"op": "bind", "src": str(data), "dst": point}]
        return ops

    def _host_path(self, node: Node, host: str) -> Path:
        """What a container's ``-v HOST:...`` binds on the node: the HPC image's NCCL topology
        files; under /mnt, the node's own /mnt, or the file system mounted there (Docker makes
        a missing source an empty folder, docs.docker.com, bind mounts with -v); else HOST."""
        if host == "/opt/microsoft":
            return node.hw / "opt-microsoft"
        if not host.startswith("/mnt/"):
            return Path(host)
        data = self.nvme(node).mounted(host) if self.pool.nvme_disks else None
        if data is not None:
            return data
        folder = node.hw / "mnt" / host.removeprefix("/mnt/")
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _start_units(self, node: Node, mounts: list[dict[str, Any]]) -> None:
        """Start the transient units the start task asked systemd for, as root."""
        for request in sorted((node.hw / "units").glob("*.json")):
            unit = json.loads(request.read_text())
            request.unlink()
            env = {"PATH": f"{node.hw / 'bin'}:{DEFAULT_PATH}", **unit["env"]}
            log = self.base / "logs" / f"unit-{unit['name']}-n{node.index}.log"
            name = f"unit-{unit['name']}-n{node.index}-{len(node.units)}"
            proc = self.spawn(node, name, argv=unit["argv"], env=env, cwd=Path("/"), user=ROOT,
                              stdout=log, stderr=log, mounts=mounts)  # fmt: skip
            node.units.append(proc)

    # --- containers ------------------------------------------------------------------------------
    def _check_container(self, settings: dict[str, Any]) -> None:
        image = settings.get("imageName", "")
        registry = (settings.get("registry") or {}).get("registryServer")
        if registry and not image.startswith(f"{registry}/"):
            raise PayloadError(f"imageName {image} is not in registry {registry}")
        identity = ((settings.get("registry") or {}).get("identityReference") or {}).get(
            "resourceId"
        )
        if identity and identity not in self.pool.identity_ids:
            raise PayloadError(
                f"registry identity {identity} is not one of the pool's identities "
                f"{list(self.pool.identity_ids)}"
            )

    def _bind_sources(self, node: Node, task_dir: Path, job_prep_dir: Path | None) -> dict:
        # ContainerHostDataPath (Batch REST): each name is one of the node's Batch folders,
        # mounted at the same path; "Shared" under the cluster's reading (SHARED_READINGS).
        # The emulator's AZ_BATCH_TASK_SHARED_DIR is the task's folder (see _task_env).
        sources = {
            "task": task_dir,
            "shared": node.shared_dir if self.shared == "node" else task_dir,
            "startup": node.startup_dir,
            "vfsmounts": node.mounts_dir,
            "applications": node.root / "applications",
        }
        if job_prep_dir is None:
            # A JobPrep mount on a job without a preparation task: Batch does not say what it
            # mounts; Docker creates a missing bind source empty, so the emulator does too.
            job_prep_dir = task_dir.parent / "jobpreparation"
            job_prep_dir.mkdir(parents=True, exist_ok=True)
        sources["jobprep"] = job_prep_dir
        return sources

    def _batch_binds(
        self, node: Node, settings: dict[str, Any], task_dir: Path, job_prep_dir: Path | None
    ) -> list[tuple[Path, bool]]:
        """The Batch folders Batch binds into a task's container, each at its own path."""
        # BatchTaskContainerSettings.containerHostBatchBindMounts: "If this array is null or be
        # not present, container task will mount ... AZ_BATCH_NODE_ROOT_DIR in Linux. It won't
        # mount any data paths into container if this array is set as empty."
        entries = settings.get("containerHostBatchBindMounts")
        if entries is None:
            return [(node.root, False)]
        sources = self._bind_sources(node, task_dir, job_prep_dir)
        keep: list[tuple[Path, bool]] = []
        for entry in entries:
            source = sources.get(_lower(entry.get("source")))
            if source is None:
                raise PayloadError(f"containerHostBatchBindMounts: no {entry.get('source')}")
            if any(source == kept for kept, _ in keep):
                continue  # "Shared" read as the task's folder: Batch mounts a folder once
            keep.append((source, bool(entry.get("isReadOnly"))))
        return keep

    def _container_mounts(
        self,
        node: Node,
        settings: dict[str, Any],
        task_dir: Path,
        job_prep_dir: Path | None,
        options: Any,
        stage: Path,
    ) -> list[dict[str, Any]]:
        ops = self._node_mounts(node, stage)
        keep = self._batch_binds(node, settings, task_dir, job_prep_dir)
        # Everything of the Batch tree that is not mounted is absent in the container, and so
        # are the other emulated nodes' trees.
        ops += _hide_except(self.base / "nodes", keep, stage / "batch")
        # The image's file system: the image's /opt (its venv, the CUDA base's entrypoint),
        # the interpreter the venv links to, readable by any user as in the image.
        under_opt = [
            (path, True)
            for path in (REPO.resolve(), Path(sys.base_prefix).resolve())
            if Path("/opt") in path.parents
        ]
        ops += _hide_except(Path("/opt"), under_opt, stage / "opt")
        ops.append({"op": "mkdir", "dst": "/opt/venv"})
        ops.append({"op": "bind", "src": str(REPO / ".venv"), "dst": "/opt/venv", "ro": True})
        ops.append({"op": "mkdir", "dst": str(Path(NVIDIA_ENTRYPOINT).parent)})
        ops.append(
            {
                "op": "file",
                "dst": NVIDIA_ENTRYPOINT,
                "content": '#!/bin/bash\n# NVIDIA CUDA banner omitted\nexec "$@"\n',
                "mode": 0o755,
            }
        )
        ops += _readable_runtime(stage / "runtime")
        ops += self._image_code(stage / "checkout")
        if any(container.startswith("/mnt/") for _, container, _ in options.volumes):
            ops.append({"op": "bind", "src": str(node.hw / "mnt"), "dst": "/mnt"})
        for host, container, read_only in options.volumes:
            source = self._host_path(node, host)
            if not source.exists():
                raise PayloadError(f"-v {host}: not on the node (Docker would create it empty)")
            if not container.startswith(("/opt/", "/mnt/")) and not Path(container).exists():
                self.log(f"node {node.index}: volume {container} not emulated (no mount point)")
                continue
            ops.append({"op": "mkdir", "dst": container})
            ops.append({"op": "bind", "src": str(source), "dst": container, "ro": read_only})
        return ops

    def _image_code(self, stage: Path) -> list[dict[str, Any]]:
        """The image's code and nothing else of the checkout: ``trainer/`` where the image
        copies it (docker/Dockerfile: ``COPY trainer /opt/trainer/trainer`` under its ``ENV
        PYTHONPATH=/opt/trainer``), and the checkout reduced to its ``.venv`` (the image's
        /opt/venv, whose console scripts name it): examples/, tests/, infra/ are not there."""
        pythonpath = self.image.env_dict().get("PYTHONPATH", "").split(":")[0]
        if not pythonpath:
            raise PayloadError("the image sets no PYTHONPATH: where does it keep trainer/?")
        target = str(Path(pythonpath) / "trainer")
        return [
            {"op": "mkdir", "dst": target},
            {"op": "bind", "src": str(REPO / "trainer"), "dst": target, "ro": True},
            *_hide_except(REPO, [(REPO / ".venv", True)], stage),
        ]

    def run_container(
        self,
        node: Node,
        name: str,
        *,
        task: dict[str, Any],
        command_line: str,
        task_dir: Path,
        job_prep_dir: Path | None,
        env: dict[str, str],
        stdout: Path,
        stderr: Path,
        keep_alive: bool,
    ) -> Proc:
        """A container task: ``docker create [options] IMAGE COMMAND`` then start, as Batch
        does (batch-docker-container-workloads.md); the process runs as the task's user
        ("For Linux, Batch will map the user/group permission to the container")."""
        settings = task["containerSettings"]
        self._check_container(settings)
        user = _user_of(task.get("userIdentity"))
        image_default = _lower(settings.get("workingDirectory")) == "containerimagedefault"
        batch_args = batch_create_args(
            gpu_pool=self.pool.gpus > 0,
            user=user,
            workdir=None if image_default else env["AZ_BATCH_TASK_WORKING_DIR"],
            env=env,
            binds=[
                (str(path), ro)
                for path, ro in self._batch_binds(node, settings, task_dir, job_prep_dir)
            ],
        )
        options = docker_create_options(batch_args, settings.get("containerRunOptions"))
        for device in options.devices:
            if device != "/dev/infiniband":  # the HPC image's RDMA devices exist on IB sizes
                raise PayloadError(f"--device {device}: not on the node")
        argv = container_argv(self.image, command_line, options.entrypoint)
        if not argv:
            raise PayloadError("no command: empty command line and the image has no CMD")
        workdir = (
            Path(self.image.workdir or "/")
            if image_default
            else Path(env["AZ_BATCH_TASK_WORKING_DIR"])
        )
        if options.workdir:
            workdir = Path(options.workdir)
        image_env = self.image.env_dict()
        container_env = {
            **image_env,
            # The GPUs Batch enables come with the driver's tools on PATH.
            "PATH": f"{node.hw / 'bin'}:{image_env.get('PATH', DEFAULT_PATH)}",
            # Docker sets HOME from the image's /etc/passwd; the task uid is not in it.
            "HOME": "/",
            "HOSTNAME": node.hostname,  # --network host: the node's hostname
            **options.env,
            # "All task environment variables are mapped into the container".
            **env,
            # The emulated storage's TLS certificate is a private one the node trusts.
            "REQUESTS_CA_BUNDLE": str(self.storage.ca_file),
        }
        if not self.fabric.isolated:
            container_env["AZURE_POD_IDENTITY_AUTHORITY_HOST"] = node.imds_endpoint  # type: ignore[attr-defined]
            container_env["AZURE_IMDS_URL"] = node.imds_endpoint  # type: ignore[attr-defined]
        stage = self.base / "stage" / name
        stage.mkdir(parents=True, exist_ok=True)
        mounts = self._container_mounts(node, settings, task_dir, job_prep_dir, options, stage)
        return self.spawn(
            node,
            name,
            argv=argv,
            env=container_env,
            cwd=workdir,
            user=user,
            stdout=stdout,
            stderr=stderr,
            mounts=mounts,
            rlimits=options.ulimits,
            keep_alive=keep_alive,
            new_ipc=options.ipc != "host",
            # Without host networking the container would get its own address on a Docker
            # bridge, unreachable from the other nodes; the emulator gives it no network.
            new_net=options.network != "host",
        )

    def hold_batch_port(self, node: Node) -> subprocess.Popen[bytes]:
        return self._helper(node, "hold", "0.0.0.0", str(BATCH_PORT))

    def upload_outputs(self, node: Node, task: dict[str, Any], env: dict[str, str], code: int):
        """The task's output files, uploaded by the node (see ``output_uploads``) with the
        identity each destination names."""
        uploads = output_uploads(task, env, code, self.identities)
        if not uploads:
            return
        spec = self.base / "specs" / f"upload-{time.monotonic_ns()}.json"
        spec.write_text(json.dumps({"uploads": uploads}))
        env_vars = {**os.environ, "REQUESTS_CA_BUNDLE": str(self.storage.ca_file)}
        if not self.fabric.isolated:
            env_vars["AZURE_POD_IDENTITY_AUTHORITY_HOST"] = node.imds_endpoint  # type: ignore[attr-defined]
        result = subprocess.run(
            [*self.fabric.exec_prefix(node.ns), sys.executable, str(AGENT), "upload", str(spec)],
            capture_output=True,
            text=True,
            env=env_vars,
            timeout=120,
        )
        self.log(f"node {node.index}: output upload exit {result.returncode}: {result.stdout}")
        if result.returncode != 0:
            # fileuploaderr.txt on a real node; the task gets a failure info, not a retry.
            (node.root / "fileuploaderr.txt").write_text(result.stderr)
            self.log(f"node {node.index}: output upload failed: {result.stderr[-2000:]}")

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
        self._platform_stop.set()
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


# --- a job and its multi-instance task ------------------------------------------------------------
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
        self.prep_exit: dict[int, int | None] = {}
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
        prepared: set[tuple[int, int, int]] = set()  # the nodes' boots that ran it
        attempt = 0
        while self._schedule(instances, prepared):
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

    def _schedule(self, instances: int, prepared: set[tuple[int, int, int]]) -> bool:
        """Chooses the task's nodes (and runs the job preparation on them); False when the
        task was terminated while it waited for nodes."""
        prep = self.job.get("jobPreparationTask")
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
            if prep is None:
                return True
            self.state = "preparing"
            # JobPreparationTask.rerunOnNodeRebootAfterSuccess (default true): it runs again
            # after a reboot, and "is always rerun if a Compute Node is reimaged", as a
            # preempted Spot node is (batch-spot-vms.md; both read 2026-11-28).
            again = bool(prep.get("rerunOnNodeRebootAfterSuccess", True))

            def boot(n: Node, again: bool = again) -> tuple[int, int, int]:
                return (n.index, n.reimages, n.reboots if again else 0)

            todo = [n for n in self.nodes if boot(n) not in prepared]
            threads = [threading.Thread(target=self._prepare, args=(n, prep)) for n in todo]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for node in todo:
                if self.prep_exit.get(node.index) == 0:
                    prepared.add(boot(node))
            ready = all(boot(n) in prepared for n in self.nodes)
            if ready or prep.get("waitForSuccess") is False:
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

    def prep_failed(self) -> set[int]:
        prep = self.job.get("jobPreparationTask")
        if prep is None or prep.get("waitForSuccess") is False:
            return set()
        return {i for i, code in self.prep_exit.items() if code not in (None, 0)}

    def _env(self, node: Node, task_id: str, task_dir: Path) -> dict[str, str]:
        env = {
            **self.cluster._base_env(node),
            "AZ_BATCH_JOB_ID": self.job["id"],
            "AZ_BATCH_TASK_ID": task_id,
            "AZ_BATCH_TASK_DIR": str(task_dir),
            "AZ_BATCH_TASK_WORKING_DIR": str(task_dir / "wd"),
            "AZ_BATCH_CERTIFICATES_DIR": str(task_dir / "certs"),
        }
        return env

    def _prepare(self, node: Node, prep: dict[str, Any]) -> None:
        task_dir = node.job_dir(self.job["id"]) / prep.get("id", "jobpreparation")
        _task_folders(task_dir, _user_of(prep.get("userIdentity")))
        env = {
            **self._env(node, prep.get("id", "jobpreparation"), task_dir),
            **_env_settings(prep),
        }
        retries = int((prep.get("constraints") or {}).get("maxTaskRetryCount") or 0)
        for attempt in range(retries + 1):
            name = f"prep-n{node.index}-try{attempt}"
            proc = self._container_or_host(
                node, name, prep, prep["commandLine"], task_dir, None, env, task_dir, False
            )
            code = proc.wait(300)
            proc.kill()
            self.prep_exit[node.index] = code
            self.cluster.log(f"node {node.index}: job preparation try {attempt} exited {code}")
            if code == 0:
                return

    def _container_or_host(
        self,
        node: Node,
        name: str,
        task: dict[str, Any],
        command_line: str,
        task_dir: Path,
        job_prep_dir: Path | None,
        env: dict[str, str],
        out_dir: Path,
        keep_alive: bool,
        prefix: str = "",
    ) -> Proc:
        stdout, stderr = out_dir / f"{prefix}stdout.txt", out_dir / f"{prefix}stderr.txt"
        if task.get("containerSettings"):
            return self.cluster.run_container(
                node,
                name,
                task=task,
                command_line=command_line,
                task_dir=task_dir,
                job_prep_dir=job_prep_dir,
                env=env,
                stdout=stdout,
                stderr=stderr,
                keep_alive=keep_alive,
            )
        stage = self.cluster.base / "stage" / name
        stage.mkdir(parents=True, exist_ok=True)
        return self.cluster.spawn(
            node,
            name,
            argv=_command_argv(command_line),
            env={**env, "PATH": f"{node.hw / 'bin'}:{DEFAULT_PATH}"},
            cwd=Path(env["AZ_BATCH_TASK_WORKING_DIR"]),
            user=_user_of(task.get("userIdentity")),
            stdout=stdout,
            stderr=stderr,
            mounts=self.cluster._node_mounts(node, stage),
            keep_alive=keep_alive,
        )

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
            self.cluster.upload_outputs(
                self.master, self.task, envs[self.master.index], 1 if code is None else code
            )
        return code, reason

    def _task_env(self, node: Node, settings: dict[str, Any]) -> dict[str, str]:
        assert self.master is not None
        hosts = [n.ip for n in self.nodes]
        task_dir = self.task_dir(node)
        _task_folders(task_dir, _user_of(self.task.get("userIdentity")))
        for stale in task_dir.glob("*.txt"):
            stale.unlink()
        env = self._env(node, self.task["id"], task_dir)
        prep_dir = self._prep_dir(node)
        if prep_dir is not None:
            env["AZ_BATCH_JOB_PREP_DIR"] = str(prep_dir)
            env["AZ_BATCH_JOB_PREP_WORKING_DIR"] = str(prep_dir / "wd")
        if settings:
            # batch-compute-node-environment-variables.md, multi-instance variables.
            env.update(
                {
                    "AZ_BATCH_HOST_LIST": ",".join(hosts),
                    "AZ_BATCH_NODE_LIST": ";".join(hosts),
                    "AZ_BATCH_MASTER_NODE": f"{self.master.ip}:{BATCH_PORT}",
                    "AZ_BATCH_IS_CURRENT_NODE_MASTER": str(node is self.master).lower(),
                    "AZ_BATCH_TASK_SHARED_DIR": str(task_dir),
                    "CCP_NODES": f"{len(hosts)} " + " ".join(f"{h} 1" for h in hosts),
                }
            )
        env.update(_env_settings(self.task))
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
        self.application = self._container_or_host(
            master,
            f"app-try{attempt}",
            self.task,
            self.task["commandLine"],
            self.task_dir(master),
            self._prep_dir(master),
            envs[master.index],
            self.task_dir(master),
            False,
        )
        code = self._wait([self.application])[0]
        if self.terminated:
            return code, "terminated during the application command"
        return code, f"application command exited {code}"

    def prep_output(self, node: Node) -> str:
        """What the job preparation task wrote on ``node`` (stdout.txt, stderr.txt)."""
        prep = self._prep_dir(node)
        return "".join(p.read_text() for p in sorted(prep.glob("*.txt"))) if prep else ""

    def _prep_dir(self, node: Node) -> Path | None:
        prep = self.job.get("jobPreparationTask")
        if prep is None:
            return None
        return node.job_dir(self.job["id"]) / prep.get("id", "jobpreparation")

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
            self.running[node.index] = self._container_or_host(
                node,
                f"coord-n{node.index}-try{attempt}",
                self.task,
                settings["coordinationCommandLine"],
                self.task_dir(node),
                self._prep_dir(node),
                envs[node.index],
                self.task_dir(node),
                keep_alive,
                prefix,
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
                self._graceful_stop()
                return [p.code for p in procs]
            time.sleep(0.1)

    def _graceful_stop(self) -> None:
        live = [p for p in self._live()]
        if self._stop_how == "stop":
            for proc in live:
                self.cluster.log(f"terminate: SIGTERM to {proc.name}: "
                                 f"{proc.stop_signal(signal.SIGTERM)}")  # fmt: skip
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while time.monotonic() < deadline and not all(p.done.is_set() for p in live):
                time.sleep(0.1)
        for proc in live:
            if not proc.done.is_set():
                self.cluster.log(f"terminate: SIGKILL to {proc.name}")
            proc.kill()

    def _live(self) -> list[Proc]:
        procs = list(self.running.values())
        if self.application is not None:
            procs.append(self.application)
        return procs

    def _stop_all(self) -> None:
        for proc in self._live():
            proc.kill()
        self.running = {}


def output_uploads(
    task: dict[str, Any], env: dict[str, str], code: int, identities: dict[str, str]
) -> list[dict[str, str]]:
    """batch-task-output-files.md ("The Batch service then writes any output data to that
    container when the task is complete"), after each try: the files matching each
    outputFile's pattern (OutputFile.filePattern: relative to the task working directory, $VAR
    expanded first, names starting with "." not matched by wildcards) whose uploadCondition
    holds for ``code``; a pattern without wildcards uploads to the blob named by ``path``, one
    with wildcards under ``path`` as a virtual folder. For multi-instance tasks only from the
    primary's node (OutputFile docs)."""
    uploads = []
    base = Path(env["AZ_BATCH_TASK_WORKING_DIR"])
    for output in task.get("outputFiles") or []:
        condition = _lower(output["uploadOptions"]["uploadCondition"])
        if (condition == "tasksuccess" and code != 0) or (condition == "taskfailure" and code == 0):
            continue
        pattern = output["filePattern"]
        for key in sorted(env, key=len, reverse=True):
            pattern = pattern.replace(f"${{{key}}}", env[key]).replace(f"${key}", env[key])
        full = pattern if pattern.startswith("/") else str(base / pattern)
        wildcard = any(c in output["filePattern"] for c in "*?[")
        destination = output["destination"]["container"]
        identity = (destination.get("identityReference") or {}).get("resourceId")
        client = next((c for c, r in identities.items() if r == identity), None)
        if client is None:
            raise PayloadError(f"output file identity {identity} is not the pool's")
        for match in sorted(glob.glob(full, recursive=True)):
            if not os.path.isfile(match):
                continue
            blob = destination.get("path") or os.path.basename(match)
            if wildcard:
                prefix = (destination.get("path") or "").rstrip("/")
                relative = os.path.relpath(match, base)
                blob = f"{prefix}/{relative}" if prefix else relative
            uploads.append(
                {
                    "file": match,
                    "container_url": destination["containerUrl"],
                    "blob": blob,
                    "client_id": client,
                }
            )
    return uploads


# --- helpers --------------------------------------------------------------------------------------
def _command_argv(command_line: str) -> list[str]:
    """The command line is not run under a shell (batch-compute-node-environment-variables.md,
    "Command-line expansion"): Batch splits it into the program and its arguments. The split
    follows POSIX shell quoting, the documented way to pass `/bin/sh -c "..."`."""
    try:
        argv = shlex.split(command_line)
    except ValueError as error:
        raise PayloadError(f"command line cannot be split ({error}): {command_line}") from None
    if not argv:
        raise PayloadError("empty command line")
    return argv


def _asked_nodes(pool: dict[str, Any], kind: str) -> int:
    """The ``Dedicated`` or ``LowPriority`` nodes a pool asks for (fixed, or the most its formula
    sets). In a Batch-managed account low-priority nodes are Spot nodes since March 2026: "any
    use of Low-priority properties in the Azure Batch API or SDK will automatically translate
    into Spot-based compute node allocations" (Azure/Batch #196, 2026-02-25, read 2026-11-28)."""
    scale = pool.get("scaleSettings") or {}
    fixed = scale.get("fixedScale")
    if fixed:
        return int(fixed.get(f"target{kind}Nodes") or 0)
    formula = str((scale.get("autoScale") or {}).get("formula") or "")
    asked = re.search(rf"\$Target{kind}Nodes\s*=([^;]*);", formula)
    return max((int(n) for n in re.findall(r"\d+", asked.group(1))), default=0) if asked else 0


def _user_of(identity: dict[str, Any] | None) -> tuple[int, int]:
    auto = (identity or {}).get("autoUser") or {}
    if identity and identity.get("username"):
        raise PayloadError("named user accounts are not emulated")
    return ROOT if _lower(auto.get("elevationLevel")) == "admin" else TASK_USER


def _env_settings(task: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in task.get("environmentSettings") or []}


def _task_folders(task_dir: Path, user: tuple[int, int]) -> None:
    """The task folder and its working directory, the task user's (files-and-directories.md:
    the task has read/write access to its working directory)."""
    for folder in (task_dir, task_dir / "wd"):
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, *user)
        os.chmod(folder, 0o755)


def _hide_except(root: Path, keep: list[tuple[Path, bool]], stage: Path) -> list[dict[str, Any]]:
    """Mount operations that make ``root`` an empty folder except for ``keep`` (re-mounted at
    the same paths, read-only where asked)."""
    ops: list[dict[str, Any]] = [{"op": "tmpfs", "dst": str(stage)}]
    for i, (path, _) in enumerate(keep):
        ops.append({"op": "bind", "src": str(path), "dst": str(stage / str(i))})
    ops.append({"op": "tmpfs", "dst": str(root)})
    for i, (path, read_only) in enumerate(keep):
        ops.append({"op": "mkdir", "dst": str(path)})
        ops.append({"op": "bind", "src": str(stage / str(i)), "dst": str(path), "ro": read_only})
    ops.append({"op": "umount", "dst": str(stage)})
    return ops


def _readable_runtime(stage: Path) -> list[dict[str, Any]]:
    """The interpreter the venv links to and this checkout (its venv and trainer/ are the
    image's: ``Cluster._image_code``), reachable by any uid as in the image: a folder above
    them that only root may enter (e.g. /root) is replaced, in the container, by one that holds
    just them."""
    base = Path(sys.base_prefix).resolve()
    ops: list[dict[str, Any]] = []
    for target in (base, REPO):
        for ancestor in reversed(target.parents):
            if ancestor == Path("/"):
                continue
            mode = ancestor.stat().st_mode
            if not mode & stat.S_IXOTH:
                ops += _hide_except(ancestor, [(target, True)], stage / ancestor.name)
                break
    return ops


# systemd-run (--unit, --setenv and the command; the other options change nothing here) and
# systemctl (stop: units end when the node restarts, and the emulator reruns the start task
# only then; reboot).
_SYSTEMD_STUB = """#!{python}
import json, os, sys
from pathlib import Path
hw, tool, args = Path({hw!r}), os.path.basename(sys.argv[0]), sys.argv[1:]
if tool == "systemctl":
    if args[:1] == ["reboot"]:
        (hw / "reboot-requested").touch()
    sys.exit(0)
name, env = "", {{}}
while args and args[0].startswith("--"):
    option = args.pop(0)
    if option.startswith("--unit="):
        name = option.split("=", 1)[1]
    elif option.startswith("--setenv="):
        key, _, value = option.split("=", 1)[1].partition("=")
        env[key] = value
(hw / "units" / (name + ".json")).write_text(json.dumps({{"name": name, "env": env, "argv": args}}))
"""


def _nvidia_smi(gpus: int, name: str, driver: str) -> str:
    """``nvidia-smi`` as the node's driver answers ``-L`` and ``--query-gpu=...``."""
    listing = "\n".join(
        f"GPU {i}: NVIDIA {name} (UUID: GPU-{i:08d}-0000-0000-0000-000000000000)"
        for i in range(gpus)
    )
    # A healthy GPU: no uncorrectable ECC error since boot, no row remapping pending or failed.
    values = {
        "driver_version": driver,
        "name": f"NVIDIA {name}",
        "count": str(gpus),
        "ecc.errors.uncorrected.volatile.total": "0",
    }
    if gpus == 0:
        # The HPC image's driver on a VM without GPUs: nvidia-smi is there and fails.
        return (
            "#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the "
            "NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.'\n"
            "exit 9\n"
        )
    return f"""#!/bin/bash
# Emulated nvidia-smi: {gpus} x NVIDIA {name}, driver {driver}. Output is written at once, as
# the real tool's is (a reader that stops early does not make it fail).
listing='{listing}'
case "$1" in
-L|--list-gpus) [ -n "$listing" ] && printf '%s\\n' "$listing" ;;
--query-gpu=*)
  IFS=, read -ra fields <<< "${{1#--query-gpu=}}"
  out=""
  for ((i = 0; i < {gpus}; i++)); do
    row=""
    for field in "${{fields[@]}}"; do
      case "$field" in
{chr(10).join(f"        {k}) value='{v}' ;;" for k, v in values.items())}
        index) value="$i" ;;
        *) echo "Field \\"$field\\" is not a valid field to query." >&2; exit 2 ;;
      esac
      row="${{row:+$row, }}$value"
    done
    out+="$row"$'\\n'
  done
  printf '%s' "$out" ;;
--query-remapped-rows=*)
  for ((i = 0; i < {gpus}; i++)); do printf '00000000:%02X:00.0, 0, 0\n' $((i + 24)); done ;;
*) echo "NVIDIA-SMI {driver}    GPUs: {gpus}" ;;
esac
"""
