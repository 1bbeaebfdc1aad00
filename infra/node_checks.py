"""What a pool node checks about itself, and how a sick node keeps itself out of the pool.

The start task (as the node's admin) writes the node's check to STATE_DIR and runs it: every GPU
on a new enough driver and healthy, no failed file system, the size's InfiniBand ports active;
a node that fails never receives a task. It then leaves a watcher running (a systemd unit):
when a launcher on the node asks after a failed try (trainer/launch/recheck.py), the watcher
runs the check again, and a node that fails it now records why in KEPT_OUT and restarts. The
start task that runs after the restart refuses any node with that record, so Batch gives it no
task again until it is removed from the pool. docs/jobs.md, A node that fails, says why this
and not the pool's rights on the nodes. The bash is in infra/node_scripts/ (start_task.sh and
the scripts it writes and runs); this module fills it with the numbers and paths below.
"""

from __future__ import annotations

from infra.batch import NVME_DEVICE, NVME_ROOT
from infra.cloud_init import RUNS_DIR, RUNS_MODE
from infra.job_spec import NFS_RELATIVE_MOUNT
from infra.node_scripts import in_bash, render
from infra.toolchain import CUDA, MIN_DRIVER
from trainer.launch.recheck import RECORD_SECONDS, REQUEST, VERDICT

# What the start task prints on the CPU acceptance size (0 GPUs): the skip is visible in each
# node's startup/stdout.txt, never silent.
CPU_SKIP_MESSAGE = "node ok: CPU acceptance profile, GPU and InfiniBand checks skipped"
# What it prints on a GPU size: n and driver are gpu_checks.sh's, ib is ib_checks.sh's.
GPU_OK = "node ok: $n GPUs, driver $driver, $ib active InfiniBand ports"

# On the node's OS disk: it survives a restart (where the kernel log and the GPUs' volatile ECC
# counts, which the check reads, start afresh) and goes with a reimage or the node's removal.
STATE_DIR = "/var/lib/distributed-training"
KEPT_OUT = f"{STATE_DIR}/kept-out"
WATCH_UNIT = "dt-node-watch"
CHECK_TIMEOUT_SECONDS = 60

# GPU Xids that mean the hardware, not the program, failed (an uncorrectable memory error, a
# row remapping, a GPU fallen off the bus, an NVLink error...): the list Azure's own node health
# checks fail a node on (Azure/azurehpc-health-checks, customTests/azure_gpu_xid.nhc, XID_EC).
CRITICAL_XIDS = (48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120)

# How long the start task waits for InfiniBand ports to turn ACTIVE, polling every
# IB_POLL_SECONDS. After boot a port sits in INIT (link up, not yet configured by the subnet
# manager; Documentation/infiniband/sysfs.txt lists DOWN, INIT, ARMED, ACTIVE) and the VF
# itself is attached asynchronously on Azure's HPC sizes; Azure documents no bound. Slurm
# sites wait up to 180 s at boot (OleHolmNielsen/Slurm_tools InfiniBand/waitforib.sh); five
# minutes leaves room above that, and costs a broken node five minutes before it fails. The
# watcher's check, on a node that was running, does not wait.
IB_WAIT_SECONDS = 300
IB_POLL_SECONDS = 5


def node_check_command(gpus: int, ib_ports: int, nvme_disks: int = 0) -> str:
    """The start task (node_scripts/start_task.sh): refuse a node that kept itself out; write
    and run the node's check (waiting for InfiniBand ports); mount the local NVMe array
    (``nvme_disks`` of them, 0 for none); make the shared runs folder; start the watcher.

    A size without GPUs (the CPU acceptance size, ``infra.sizes.CPU_ACCEPTANCE``) has no driver
    or InfiniBand to check: its check skips those, and the task says so."""
    nvme = (
        render("nvme_array.sh", NVME_ROOT=NVME_ROOT, NVME_DEVICE=NVME_DEVICE, NVME_DISKS=nvme_disks)
        if nvme_disks
        else ""
    )
    script = render(
        "start_task.sh",
        KEPT_OUT=KEPT_OUT,
        STATE_DIR=STATE_DIR,
        NODE_CHECK=_node_check(gpus, ib_ports),
        NODE_WATCH=_node_watch(),
        NVME_ARRAY=nvme,
        NFS_RELATIVE_MOUNT=NFS_RELATIVE_MOUNT,
        RUNS_DIR=RUNS_DIR,
        RUNS_MODE=RUNS_MODE,
        WATCH_UNIT=WATCH_UNIT,
    )
    return in_bash(script)


def _node_check(gpus: int, ib_ports: int) -> str:
    """The node's check (node_scripts/node_check.sh): on a GPU size with its GPUs' and
    InfiniBand ports' checks, on the CPU acceptance size without."""
    if gpus == 0:
        return render("node_check.sh", GPU_CHECKS="", IB_CHECKS="", NODE_OK=CPU_SKIP_MESSAGE)
    gpu_checks = render(
        "gpu_checks.sh",
        GPUS=gpus,
        MIN_DRIVER=MIN_DRIVER,
        CUDA=CUDA,
        CRITICAL_XIDS="|".join(map(str, CRITICAL_XIDS)),
    )
    ib_checks = render(
        "ib_checks.sh",
        IB_PORTS=ib_ports,
        IB_WAIT_SECONDS=IB_WAIT_SECONDS,
        IB_POLL_SECONDS=IB_POLL_SECONDS,
    )
    return render("node_check.sh", GPU_CHECKS=gpu_checks, IB_CHECKS=ib_checks, NODE_OK=GPU_OK)


def _node_watch() -> str:
    """The watcher (node_scripts/node_watch.sh)."""
    return render(
        "node_watch.sh",
        REQUEST=REQUEST,
        VERDICT=VERDICT,
        STATE_DIR=STATE_DIR,
        KEPT_OUT=KEPT_OUT,
        CHECK_TIMEOUT_SECONDS=CHECK_TIMEOUT_SECONDS,
        RECORD_SECONDS=RECORD_SECONDS,
    )
