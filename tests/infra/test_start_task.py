"""The pool's start task run the way a Batch node runs it: the declared command line split into
argv (Batch starts it without a shell) and executed, with a stub ``nvidia-smi`` on PATH and a
fake ``/sys/class/infiniband`` tree bind-mounted in a private mount namespace (root only)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.batch import NFS_RELATIVE_MOUNT
from infra.cloud_init import RUNS_MODE
from infra.cluster import CPU_SKIP_MESSAGE
from infra.toolchain import MIN_DRIVER
from tests.infra.conftest import one

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare for a private /sys/class/infiniband",
)

INFINIBAND = {f"mlx5_ib{i}": "InfiniBand" for i in range(8)} | {"mlx5_an0": "Ethernet"}


def fake_node(
    root: Path, *, gpus: int = 8, driver: str = MIN_DRIVER, down: set[str] = frozenset()
) -> dict[str, str]:
    """A node's tools and sysfs under ``root``; returns the environment the task gets."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    listing = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})" for i in range(gpus))
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/bash\n"
        f'if [ "$1" = -L ]; then printf "%s\\n" {shlex.quote(listing)}; exit 0; fi\n'
        f'case "$*" in *driver_version*) for _ in $(seq {gpus}); do echo {driver}; done;; esac\n'
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    for device, link_layer in INFINIBAND.items():
        port = root / "infiniband" / device / "ports" / "1"
        port.mkdir(parents=True)
        (port / "link_layer").write_text(link_layer + "\n")
        (port / "state").write_text("1: DOWN\n" if device in down else "4: ACTIVE\n")
    mounts = root / "fsmounts"
    (mounts / NFS_RELATIVE_MOUNT).mkdir(parents=True)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "AZ_BATCH_NODE_MOUNTS_DIR": str(mounts)}


def run_start_task(
    command_line: str, root: Path, env: dict[str, str]
) -> subprocess.CompletedProcess:
    argv = shlex.split(command_line)  # Batch runs the command line without a shell
    mount_fake_sysfs = (
        "mount -t tmpfs none /sys/class && mkdir /sys/class/infiniband && "
        'mount --bind "$0" /sys/class/infiniband && exec "$@"'
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "/bin/bash", "-c", mount_fake_sysfs,
         str(root / "infiniband"), *argv],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


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
    runs = Path(env["AZ_BATCH_NODE_MOUNTS_DIR"]) / NFS_RELATIVE_MOUNT / "runs"
    assert oct(runs.stat().st_mode & 0o7777) == f"0o{RUNS_MODE}"


def test_the_ethernet_nic_does_not_stand_in_for_a_down_infiniband_port(start_task, tmp_path):
    # Every InfiniBand port down; only the accelerated-networking NIC is ACTIVE.
    env = fake_node(tmp_path, down={f"mlx5_ib{i}" for i in range(8)})
    result = run_start_task(start_task, tmp_path, env)
    assert result.returncode == 1
    assert result.stderr.strip() == "start task: expected 8 active InfiniBand ports, found 0"


def test_one_down_port_fails_the_node(start_task, tmp_path):
    result = run_start_task(start_task, tmp_path, fake_node(tmp_path, down={"mlx5_ib3"}))
    assert result.returncode == 1 and "found 7" in result.stderr


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
    assert pool.inputs["vmSize"] == "Standard_D2s_v5"
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
