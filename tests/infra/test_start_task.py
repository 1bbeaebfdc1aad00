"""The pool's start task run the way a Batch node runs it: the declared command line split into
argv (Batch starts it without a shell) and executed, with a stub ``nvidia-smi`` on PATH and a
fake ``/sys/class/infiniband`` tree bind-mounted in a private mount namespace (root only).

The fake node's clock is its stub ``sleep``: each call adds its seconds to the node's time and
moves every port whose time has come to ``4: ACTIVE``, so a wait of minutes runs in
milliseconds and the test reads how long the task would have waited."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from infra.batch import NVME_DEVICE, NVME_ROOT
from infra.cloud_init import RUNS_MODE
from infra.job_spec import NFS_RELATIVE_MOUNT
from infra.node_checks import CPU_SKIP_MESSAGE, IB_WAIT_SECONDS, STATE_DIR, WATCH_UNIT
from infra.toolchain import MIN_DRIVER
from tests.batch_emulator.nvme import NvmeDisks
from tests.support.stacks import evaluate, one, stack_values
from trainer.launch.recheck import REQUEST, VERDICT

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare for a private /sys/class/infiniband",
)

TASK_USER = 65534  # nobody: not root, as Batch's non-admin task users
INFINIBAND = {f"mlx5_ib{i}": "InfiniBand" for i in range(8)} | {"mlx5_an0": "Ethernet"}


# A port's state file reads "<number>: <name>" (the kernel's ib_port_state: 1 DOWN, 2 INIT,
# 3 ARMED, 4 ACTIVE; Documentation/infiniband/sysfs.txt). INIT: the link is physically up but
# the subnet manager has not configured the port yet. Ports come up seconds after boot, later
# than the Ethernet NIC (OleHolmNielsen/Slurm_tools InfiniBand/README.md, whose waitforib.sh
# polls for up to 180 s), and on Azure the InfiniBand VF is attached asynchronously (Azure HPC
# blog "Accelerated Networking on HB, HC, HBv2, HBv3 and NDv2"). Azure documents no bound on
# how long a port may sit in INIT after the start task begins: the fake takes the hard reading,
# any port may still be INIT when the task first looks, for as long as a test says.
INIT = "2: INIT"
ACTIVE = "4: ACTIVE"


def fake_node(
    root: Path,
    *,
    gpus: int = 8,
    driver: str = MIN_DRIVER,
    down: set[str] = frozenset(),
    coming_up: dict[str, int | None] | None = None,
    ecc: dict[int, str] | None = None,
    remapped: dict[int, str] | None = None,
    kernel_log: str = "",
    nvme_disks: int = 8,
) -> dict[str, str]:
    """A node's tools and sysfs under ``root``; returns the environment the task gets.

    ``coming_up`` maps a device to the node time (seconds slept) at which its port turns ACTIVE,
    reading ``2: INIT`` until then; ``None`` keeps it INIT for good. ``ecc`` gives a GPU's
    uncorrectable ECC count since boot (as nvidia-smi prints it: "0", "3", "[N/A]"),
    ``remapped`` its row remapping's "pending, failure" (nvidia-smi --query-remapped-rows: "0, 0"
    when none), ``kernel_log`` what dmesg prints, ``nvme_disks`` how many blank local NVMe
    disks the node has (with the tools that assemble them: tests/batch_emulator/nvme.py)."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    _fake_clock(root, bin_dir, coming_up or {})
    listing = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})" for i in range(gpus))
    ecc_rows = "\n".join(f"{i}, {(ecc or {}).get(i, '0')}" for i in range(gpus))
    remap_rows = "\n".join(
        f"00000000:{i + 0x18:02X}:00.0, {(remapped or {}).get(i, '0, 0')}" for i in range(gpus)
    )
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/bash\n"
        f'if [ "$1" = -L ]; then printf "%s\\n" {shlex.quote(listing)}; exit 0; fi\n'
        'case "$*" in\n'
        f"  *driver_version*) for _ in $(seq {gpus}); do echo {driver}; done;;\n"
        f'  *ecc.errors.uncorrected.volatile.total*) printf "%s\\n" {shlex.quote(ecc_rows)};;\n'
        f'  *--query-remapped-rows*) printf "%s\\n" {shlex.quote(remap_rows)};;\n'
        "esac\n"
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    (bin_dir / "dmesg").write_text(f"#!/bin/bash\nprintf '%s' {shlex.quote(kernel_log)}\n")
    (bin_dir / "dmesg").chmod(0o755)
    for device, link_layer in INFINIBAND.items():
        port = root / "infiniband" / device / "ports" / "1"
        port.mkdir(parents=True)
        (port / "link_layer").write_text(link_layer + "\n")
        state = "1: DOWN" if device in down else INIT if device in (coming_up or {}) else ACTIVE
        (port / "state").write_text(state + "\n")
    # systemd as the task uses it: each call's arguments, one line per call.
    for tool in ("systemd-run", "systemctl"):
        (bin_dir / tool).write_text(f'#!/bin/bash\necho "$*" >> {shlex.quote(str(root))}/{tool}\n')
        (bin_dir / tool).chmod(0o755)
    (root / "var-lib").mkdir()  # the node's /var/lib (its OS disk)
    (root / "mnt").mkdir()  # the node's /mnt, where the NVMe array is mounted
    disks = NvmeDisks(root, nvme_disks)
    disks.lose()
    disks.install(bin_dir)
    (root / "batch").mkdir()
    mounts = root / "fsmounts"
    (mounts / NFS_RELATIVE_MOUNT).mkdir(parents=True)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "AZ_BATCH_NODE_MOUNTS_DIR": str(mounts),
        "AZ_BATCH_NODE_ROOT_DIR": str(root / "batch"),
        "AZ_BATCH_POOL_ID": "ib-gpu",
        "AZ_BATCH_NODE_ID": "tvm-1234567890_1-20261127t000000z",
    }


def _fake_clock(root: Path, bin_dir: Path, coming_up: dict[str, int | None]) -> None:
    """A stub ``sleep`` that advances the node's clock (``root/clock``, seconds slept, one line
    per call in ``root/sleeps``) and turns each port in ``coming_up`` ACTIVE once its time has
    come. It writes to the tree bind-mounted over /sys/class/infiniband, so the task sees it."""
    schedule = "".join(f"{dev} {at}\n" for dev, at in coming_up.items() if at is not None)
    (root / "schedule").write_text(schedule)
    (root / "clock").write_text("0\n")
    (bin_dir / "sleep").write_text(
        "#!/bin/bash\n"
        f"root={shlex.quote(str(root))}\n"
        'echo "$1" >> "$root/sleeps"\n'
        'now=$(( $(cat "$root/clock") + $1 ))\n'
        'echo "$now" > "$root/clock"\n'
        "while read -r dev at; do\n"
        f'  [ "$now" -lt "$at" ] || echo {ACTIVE!r} > "$root/infiniband/$dev/ports/1/state"\n'
        'done < "$root/schedule"\n'
    )
    (bin_dir / "sleep").chmod(0o755)


def slept(root: Path) -> list[int]:
    """The seconds of each ``sleep`` the task called, in order."""
    sleeps = root / "sleeps"
    return [int(line) for line in sleeps.read_text().split()] if sleeps.exists() else []


def run_start_task(
    command_line: str, root: Path, env: dict[str, str]
) -> subprocess.CompletedProcess:
    argv = shlex.split(command_line)  # Batch runs the command line without a shell
    return on_node(argv, root, env)


def on_node(argv: list[str], root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``argv`` run as on the fake node: its /sys/class/infiniband, /var/lib and /mnt."""
    # The host's own mount: the node's PATH has the NVMe tools' stand-in first.
    mount_fake_node = (
        'mount() { /usr/bin/mount "$@"; }; '
        "mount -t tmpfs none /sys/class && mkdir /sys/class/infiniband && "
        'mount --bind "$0/infiniband" /sys/class/infiniband && '
        'mount --bind "$0/var-lib" /var/lib && mount --bind "$0/mnt" /mnt && exec "$@"'
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "/bin/bash", "-c", mount_fake_node,
         str(root), *argv],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def watch_until_answered(task: Path, root: Path, env: dict[str, str]):
    """The watcher, run until it has answered the request in ``task`` (the answer a regular
    file, the request gone) or has ended by itself: exit 124 when it was still watching, else
    its own code. It waits for the event, not for a moment: a busy machine is slow to answer."""
    answered = f"[ ! -e {task / REQUEST} ] && [ -f {task / VERDICT} ] && [ ! -L {task / VERDICT} ]"
    script = (
        f"/bin/bash {STATE_DIR}/node-watch & w=$!; "
        f"until {answered} || ! kill -0 $w 2>/dev/null; do /bin/sleep 0.1; done; "
        "if kill -0 $w 2>/dev/null; then kill $w; wait $w; exit 124; fi; wait $w"
    )
    return on_node(["timeout", "150", "/bin/bash", "-c", script], root, env)


@pytest.fixture
def start_task(dev_plan) -> str:
    pool = one(dev_plan, "azure-native:batch:Pool")
    assert pool.inputs["startTask"]["waitForSuccess"] is True  # a failed node gets no task
    return pool.inputs["startTask"]["commandLine"]


def test_a_healthy_node_passes_and_gets_a_runs_folder_every_task_user_can_write(
    start_task, tmp_path
):
    env = fake_node(tmp_path)
    result = run_start_task(start_task, tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert "node ok: 8 GPUs" in result.stdout and "8 active InfiniBand ports" in result.stdout
    assert slept(tmp_path) == []  # every port ACTIVE at once: no wait
    runs = Path(env["AZ_BATCH_NODE_MOUNTS_DIR"]) / NFS_RELATIVE_MOUNT / "runs"
    assert oct(runs.stat().st_mode & 0o7777) == f"0o{RUNS_MODE}"


def test_the_ethernet_nic_does_not_stand_in_for_a_down_infiniband_port(start_task, tmp_path):
    # Every InfiniBand port down; only the accelerated-networking NIC is ACTIVE.
    env = fake_node(tmp_path, down={f"mlx5_ib{i}" for i in range(8)})
    result = run_start_task(start_task, tmp_path, env)
    assert result.returncode == 1
    down = ", ".join(f"mlx5_ib{i}/ports/1 is 1: DOWN" for i in range(8))
    assert result.stderr.strip() == (
        f"start task: expected 8 active InfiniBand ports, found 0 after waiting"
        f" {IB_WAIT_SECONDS} s: {down}"
    )


def test_one_down_port_fails_the_node_once_the_wait_is_over(start_task, tmp_path):
    result = run_start_task(start_task, tmp_path, fake_node(tmp_path, down={"mlx5_ib3"}))
    assert result.returncode == 1 and "found 7" in result.stderr
    assert result.stderr.strip().endswith(": mlx5_ib3/ports/1 is 1: DOWN")
    assert sum(slept(tmp_path)) == IB_WAIT_SECONDS


def test_ports_still_in_init_after_boot_are_waited_for_until_active(start_task, tmp_path):
    # Two ports still INIT when the task starts; the subnet manager activates them at 40 s and
    # 90 s of the node's clock. The node passes, having waited (at least) until the last one.
    env = fake_node(tmp_path, coming_up={"mlx5_ib3": 40, "mlx5_ib5": 90})
    result = run_start_task(start_task, tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert "8 active InfiniBand ports" in result.stdout
    assert 90 <= sum(slept(tmp_path)) < 90 + max(slept(tmp_path))
    assert f"InfiniBand ports active after {sum(slept(tmp_path))} s" in result.stdout
    assert result.stderr == ""


def test_a_port_still_in_init_when_the_wait_is_over_fails_the_node_naming_it(start_task, tmp_path):
    # mlx5_ib3 never leaves INIT (no subnet manager reaches it); mlx5_ib5 recovers at 60 s.
    env = fake_node(tmp_path, coming_up={"mlx5_ib3": None, "mlx5_ib5": 60})
    result = run_start_task(start_task, tmp_path, env)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"start task: expected 8 active InfiniBand ports, found 7 after waiting"
        f" {IB_WAIT_SECONDS} s: mlx5_ib3/ports/1 is 2: INIT"
    ]
    assert sum(slept(tmp_path)) == IB_WAIT_SECONDS  # bounded: the node stops waiting
    assert "node ok" not in result.stdout


def test_a_missing_gpu_or_an_old_driver_fails_the_node(start_task, tmp_path):
    missing = run_start_task(start_task, tmp_path, fake_node(tmp_path, gpus=7))
    assert missing.returncode == 1
    assert missing.stderr.strip() == "start task: expected 8 GPUs, nvidia-smi lists 7"
    other = tmp_path / "old"
    other.mkdir()
    old = run_start_task(start_task, other, fake_node(other, driver="570.172.08"))
    assert old.returncode == 1 and "570.172.08 is older than 580.65.06" in old.stderr
    newer = tmp_path / "new"
    newer.mkdir()
    assert run_start_task(start_task, newer, fake_node(newer, driver="580.105.08")).returncode == 0


def test_the_cpu_acceptance_size_skips_gpu_and_infiniband_checks_and_says_so(
    acceptance_plan, tmp_path
):
    pool = one(acceptance_plan, "azure-native:batch:Pool")
    assert pool.inputs["vmSize"] == "Standard_D2ds_v5"
    assert pool.inputs["startTask"]["waitForSuccess"] is True
    # A D-series node: no nvidia-smi on PATH, no InfiniBand device at all.
    env = fake_node(tmp_path, gpus=0)
    (tmp_path / "bin" / "nvidia-smi").unlink()
    for device in (tmp_path / "infiniband").iterdir():
        shutil.rmtree(device)
    result = run_start_task(pool.inputs["startTask"]["commandLine"], tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == CPU_SKIP_MESSAGE  # visible in the node's startup/stdout.txt
    assert result.stderr == ""
    runs = Path(env["AZ_BATCH_NODE_MOUNTS_DIR"]) / NFS_RELATIVE_MOUNT / "runs"
    assert oct(runs.stat().st_mode & 0o7777) == f"0o{RUNS_MODE}"


def test_a_gpu_size_never_takes_the_skip(start_task, tmp_path):
    # The same node without GPUs fails a GPU pool's start task: the skip is the CPU size's only.
    env = fake_node(tmp_path, gpus=0)
    result = run_start_task(start_task, tmp_path, env)
    assert result.returncode == 1 and "expected 8 GPUs, nvidia-smi lists 0" in result.stderr
    assert CPU_SKIP_MESSAGE not in result.stdout


# How the driver logs an Xid (NVIDIA's Xid catalog, "NVRM: Xid (PCI:<bus>): <xid>, ...").
FALLEN_OFF_THE_BUS = (
    "[  812.331204] NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.\n"
)
# ext4 after an I/O error on the node's temporary disk (fs/ext4/super.c, ext4_handle_error).
READ_ONLY_DISK = (
    "[ 1204.552101] EXT4-fs error (device sdb1): ext4_journal_check_start:83: comm python: "
    "Detected aborted journal\n"
    "[ 1204.552190] EXT4-fs (sdb1): Remounting filesystem read-only\n"
)
APPLICATION_FAULT = (
    "[  950.102311] NVRM: Xid (PCI:0000:1b:00): 13, pid=4242, name=python, Graphics SM "
    "Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address\n"
)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ({"ecc": {3: "2"}}, "GPU 3: 2 uncorrectable ECC errors since boot; this node's GPU"),
        ({"remapped": {5: "1, 0"}}, "GPU 00000000:1D:00.0: a row remapping is pending"),
        ({"remapped": {0: "0, 1"}}, "GPU 00000000:18:00.0: a row remapping failed"),
        (
            {"kernel_log": APPLICATION_FAULT + FALLEN_OFF_THE_BUS},
            "GPU Xid error in the kernel log since boot: Xid (PCI:0000:9b:00): 79, pid=",
        ),
        (
            {"kernel_log": READ_ONLY_DISK},
            "a file system failed since boot: EXT4-fs (sdb1): Remounting filesystem read-only",
        ),
    ],
)
def test_a_sick_gpu_fails_the_node_in_one_line_naming_it(start_task, tmp_path, fault, expected):
    """All eight GPUs are listed, on a good driver, with every link up, but one is sick."""
    result = run_start_task(start_task, tmp_path, fake_node(tmp_path, **fault))
    assert result.returncode == 1, result.stdout
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"start task: {expected}"), result.stderr
    assert "node ok" not in result.stdout


def test_what_is_not_a_hardware_fault_passes(start_task, tmp_path):
    """ECC off or not reported, a GPU without row remapping, an application's own Xid (13)."""
    env = fake_node(
        tmp_path,
        ecc={i: "[N/A]" for i in range(8)},
        remapped={0: "[N/A], [N/A]"},
        kernel_log=APPLICATION_FAULT,
    )
    result = run_start_task(start_task, tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert "node ok: 8 GPUs" in result.stdout


def test_a_node_leaves_its_watcher_running_outside_the_start_tasks_process_tree(
    start_task, tmp_path
):
    env = fake_node(tmp_path)
    result = run_start_task(start_task, tmp_path, env)
    assert result.returncode == 0, result.stderr
    state = tmp_path / "var-lib" / "distributed-training"
    assert {p.name for p in state.iterdir()} == {"node-check", "node-watch"}
    # Stopped first (a start task may run again without a restart), then a transient unit.
    assert (tmp_path / "systemctl").read_text() == f"stop {WATCH_UNIT}\n"
    assert (tmp_path / "systemd-run").read_text().split() == [
        "--quiet", "--collect", f"--unit={WATCH_UNIT}",
        f"--setenv=AZ_BATCH_NODE_ROOT_DIR={env['AZ_BATCH_NODE_ROOT_DIR']}",
        "/bin/bash", f"{STATE_DIR}/node-watch",
    ]  # fmt: skip


def test_a_node_that_kept_itself_out_fails_its_start_task_naming_why_and_the_fix(
    start_task, tmp_path
):
    env = fake_node(tmp_path)  # healthy again: the restart cleared the kernel log
    state = tmp_path / "var-lib" / "distributed-training"
    state.mkdir()
    (state / "kept-out").write_text("GPU Xid error ...: 79 since 2026-11-27T10:00:00Z\n")
    result = run_start_task(start_task, tmp_path, env)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "start task: this node kept itself out of the pool: GPU Xid error ...: 79 since "
        "2026-11-27T10:00:00Z; remove it from the pool (az batch node delete --pool-id ib-gpu "
        f"--node-list {env['AZ_BATCH_NODE_ID']}, as Owner or Contributor of the stack: it "
        "needs pools/write, which the team's Azure Batch Job Submitter role does not hold)"
    ]
    assert not (tmp_path / "systemd-run").exists()  # no watcher, no task


def test_the_watcher_answers_each_request_and_keeps_a_node_that_fails_out(
    start_task, tmp_path, request
):
    """The watcher the start task left, run as systemd runs it (root, the Batch tree in its
    environment): a request in a task's folder after a failed try gets ``ok`` while the node is
    healthy; once the kernel has remounted a disk read-only, the answer names it, the node
    records it where the next start task looks, and restarts."""
    env = fake_node(tmp_path)
    assert run_start_task(start_task, tmp_path, env).returncode == 0
    # The Batch tree as on a node: every folder down to a task's reachable by its user, who
    # owns the task's folder (pytest's own folders are root's alone).
    batch = Path(tempfile.mkdtemp(prefix="batch-root-"))
    request.addfinalizer(lambda: shutil.rmtree(batch, ignore_errors=True))
    batch.chmod(0o755)
    env["AZ_BATCH_NODE_ROOT_DIR"] = str(batch)
    task = batch / "workitems" / "job" / "job-1" / "task"
    task.mkdir(parents=True)
    os.chown(task, TASK_USER, TASK_USER)
    real = tmp_path / "real-time"  # the watcher's own sleep, fast, not the fake clock
    real.mkdir()
    (real / "sleep").write_text("#!/bin/bash\nexec /bin/sleep 0.05\n")
    (real / "sleep").chmod(0o755)
    watch_env = {**env, "PATH": f"{real}:{env['PATH']}"}
    # A link a task user left where the answer goes: replaced, never written through.
    target = tmp_path / "root-file"
    target.write_text("root's\n")
    (task / VERDICT).symlink_to(target)
    (task / REQUEST).write_text("check\n")
    watcher = watch_until_answered(task, tmp_path, watch_env)
    assert watcher.returncode == 124, watcher.stderr  # still watching once it had answered
    assert (task / VERDICT).read_text() == "ok\n" and not (task / VERDICT).is_symlink()
    assert target.read_text() == "root's\n"
    assert (task / VERDICT).stat().st_uid == TASK_USER  # written as the folder's owner
    assert not (task / REQUEST).exists()

    (tmp_path / "bin" / "dmesg").write_text(
        f"#!/bin/bash\nprintf '%s' {shlex.quote(READ_ONLY_DISK)}\n"
    )
    (task / REQUEST).write_text("check\n")
    # A sick node's watcher ends by itself once it has recorded why and restarted the node.
    argv = ["timeout", "150", "/bin/bash", f"{STATE_DIR}/node-watch"]
    watcher = on_node(argv, tmp_path, watch_env)
    assert watcher.returncode == 0, watcher.stderr  # it restarted the node and ended
    reason = "a file system failed since boot: EXT4-fs (sdb1): Remounting filesystem read-only"
    assert (task / VERDICT).read_text() == f"sick {reason}\n"
    kept = (tmp_path / "var-lib" / "distributed-training" / "kept-out").read_text()
    assert kept.startswith(f"{reason} since 20")
    assert (tmp_path / "systemctl").read_text().splitlines()[-1] == "reboot"


# --- the local NVMe disks (ND H100 v5 and H200 v5: infra.sizes nvme_disks) -----------------
def _array(root: Path) -> tuple[str, dict]:
    """(device, array) of the one array the fake node's kernel holds."""
    ((device, array),) = NvmeDisks(root, 8).arrays().items()
    return device, array


def test_a_new_node_builds_its_nvme_array_and_mounts_it_for_every_task_user(start_task, tmp_path):
    result = run_start_task(start_task, tmp_path, fake_node(tmp_path))
    assert result.returncode == 0, result.stderr
    device, array = _array(tmp_path)
    assert device == NVME_DEVICE and array["members"] == [f"/dev/nvme{k}n1" for k in range(8)]
    data = NvmeDisks(tmp_path, 8).mounted(NVME_ROOT)
    assert data is not None
    for folder in ("datasets", "code"):
        assert oct((data / folder).stat().st_mode & 0o7777) == "0o1777"
    assert f"local NVMe array of 8 disks at {NVME_ROOT}" in result.stdout


def test_a_restarted_node_mounts_the_array_the_kernel_assembled_and_keeps_what_it_held(
    start_task, tmp_path
):
    env = fake_node(tmp_path)
    assert run_start_task(start_task, tmp_path, env).returncode == 0
    disks = NvmeDisks(tmp_path, 8)
    _, built = _array(tmp_path)
    (disks.mounted(NVME_ROOT) / "datasets" / "kept").write_text("staged\n")
    disks.boot()  # a restart: nothing mounted, the array assembled again as /dev/md127
    again = run_start_task(start_task, tmp_path, env)
    assert again.returncode == 0, again.stderr
    device, array = _array(tmp_path)
    assert (device, array["uuid"]) == ("/dev/md127", built["uuid"])
    assert (disks.mounted(NVME_ROOT) / "datasets" / "kept").read_text() == "staged\n"
    # The start task run again in the same boot finds it mounted and leaves it as it is.
    assert run_start_task(start_task, tmp_path, env).returncode == 0
    assert (disks.mounted(NVME_ROOT) / "datasets" / "kept").read_text() == "staged\n"


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("a disk missing", "expected 8 local NVMe disks, lsblk lists 7"),
        (
            "a part of an array",
            "the local NVMe disks hold an array that does not assemble (mdadm: /dev/md128 "
            "assembled from 8 drives - not enough to start the array.)",
        ),
    ],
)
def test_disks_that_cannot_be_assembled_fail_the_node_in_one_line(
    start_task, tmp_path, fault, expected
):
    env = fake_node(tmp_path, nvme_disks=7 if fault == "a disk missing" else 8)
    if fault == "a part of an array":
        # One disk replaced by a blank one while the others kept their superblocks.
        disks = NvmeDisks(tmp_path, 8)
        for k in range(8):
            array = "v" if k == 0 else "u"
            block = json.dumps({"uuid": array, "devices": 8, "index": k})
            (disks.root / "disks" / f"nvme{k}n1").write_text(block)
        disks.boot()
    result = run_start_task(start_task, tmp_path, env)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"start task: {expected}"]
    assert "local NVMe array" not in result.stdout
    assert not (tmp_path / "systemd-run").exists()  # no watcher: the node gets no task


def test_a_size_without_nvme_disks_leaves_them_alone(tmp_path):
    plan = evaluate("dev", {**stack_values("dev"), "gpu-cluster:vmSize": "Standard_ND96asr_v4"})
    command = one(plan, "azure-native:batch:Pool").inputs["startTask"]["commandLine"]
    env = fake_node(tmp_path, nvme_disks=0)
    for tool in ("lsblk", "mdadm", "mkfs.xfs", "mount", "mountpoint"):
        (tmp_path / "bin" / tool).write_text(f"#!/bin/sh\necho {tool} called >&2\nexit 9\n")
    result = run_start_task(command, tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and "NVMe" not in result.stdout
