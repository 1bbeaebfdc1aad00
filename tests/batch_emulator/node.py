"""An emulated Batch node: its ids and names, its Batch folder tree (``AZ_BATCH_NODE_ROOT_DIR``)
and its hardware folder beside it; what a new VM's disk holds and what a lost one loses."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.batch_emulator.processes import Proc


@dataclass
class Node:
    index: int
    ip: str
    ns: str | None
    root: Path  # AZ_BATCH_NODE_ROOT_DIR
    hw: Path  # this node's hardware and host files, outside the Batch tree
    state: str = "creating"
    start_task_exit: int | None = None
    errors: list[dict[str, str]] = field(default_factory=list)  # computeNodeError: code, message
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
    imds_endpoint: str = ""  # the node's metadata service as its processes reach it

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


def make_tree(node: Node) -> None:
    """The Batch tree of a new (or reinitialized) VM, empty."""
    # files-and-directories.md: the Batch tree belongs to the agent (root); every task can
    # read and write the shared folder (batch-compute-node-environment-variables.md:
    # AZ_BATCH_NODE_SHARED_DIR "All tasks that execute on a node have read/write access").
    for folder in (node.root, node.startup_dir, node.mounts_dir, node.root / "workitems"):
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
    node.shared_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(node.shared_dir, 0o777)


def reinitialize(node: Node) -> None:
    """Empties what the VM held on its own disks: the Batch tree but its mount points."""
    for entry in list(node.root.iterdir()):
        if entry == node.mounts_dir:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    make_tree(node)
