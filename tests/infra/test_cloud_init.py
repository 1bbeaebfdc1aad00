"""The NFS server's user data, checked by the real ``cloud-init schema`` validator."""

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from infra.cloud_init import render_nfs_cloud_init


def test_user_data_passes_cloud_init_schema(tmp_path):
    cloud_init = shutil.which("cloud-init")
    assert cloud_init, "cloud-init is installed by scripts/setup_env.sh"
    path = tmp_path / "user-data.yaml"
    path.write_text(render_nfs_cloud_init(4, "10.20.0.0/20"))
    result = subprocess.run(
        [cloud_init, "schema", "--config-file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Valid cloud-config" in result.stdout + result.stderr
    # The validator really checks: a misspelt type is refused.
    path.write_text(
        render_nfs_cloud_init(4, "10.20.0.0/20").replace(
            "package_update: true", "package_update: sometimes"
        )
    )
    refused = subprocess.run(
        [cloud_init, "schema", "--config-file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0


def test_existing_data_is_never_reformatted():
    document = yaml.safe_load(render_nfs_cloud_init(3, "10.20.0.0/20"))
    script = next(
        f["content"]
        for f in document["write_files"]
        if f["path"] == "/usr/local/sbin/setup-nfs-data"
    )
    # mkfs only runs inside the branch taken when no filesystem carries the label.
    guard = script.index("if ! blkid -L nfsdata")
    assert all(script.index(m) > guard for m in ("mkfs.ext4 -L nfsdata", "mdadm --create"))
    assert script.index("mdadm --assemble --scan") < guard
    assert script.count("/dev/disk/azure/data/by-lun/") == 3


def test_export_is_limited_to_the_compute_subnet():
    document = yaml.safe_load(render_nfs_cloud_init(1, "10.20.0.0/20"))
    exports = next(f["content"] for f in document["write_files"] if f["path"] == "/etc/exports")
    assert exports == "/data 10.20.0.0/20(rw,sync,no_subtree_check,root_squash)\n"
    assert {"nfs-kernel-server", "mdadm"} <= set(document["packages"])


STUBS = {
    # Only the tools that touch disks are stubbed; bash runs the rest of the script itself.
    "mdadm": 'echo "mdadm $*" >> "$LOG"; case "$1" in --create) touch "$ROOT/dev/md/nfsdata";; '
    "--detail) echo 'ARRAY /dev/md/nfsdata';; esac",
    "blkid": '[ -f "$ROOT/formatted" ]',
    "mkfs.ext4": 'echo "mkfs $*" >> "$LOG"; touch "$ROOT/formatted"',
    "mount": 'echo "mount $*" >> "$LOG"',
}


def _run_setup_script(root, disk_count: int) -> str:
    """Run the user data's setup script with its absolute paths moved under ``root`` and the
    disk tools stubbed; returns the log of disk-tool calls."""
    document = yaml.safe_load(render_nfs_cloud_init(disk_count, "10.20.0.0/20"))
    script = next(
        f["content"]
        for f in document["write_files"]
        if f["path"] == "/usr/local/sbin/setup-nfs-data"
    )
    # Only paths that start a word: /data inside /dev/disk/azure/data/ is not the mount point.
    script = re.sub(r"(?<![\w/])(/dev/|/etc/|/data)", lambda m: f"{root}{m.group(1)}", script)
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    for folder in ("dev/md", "etc/mdadm"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for lun in range(disk_count):
        disk = root / "dev" / "disk" / "azure" / "data" / "by-lun" / str(lun)
        disk.parent.mkdir(parents=True, exist_ok=True)
        disk.touch()
    (root / "etc" / "fstab").touch()
    log = root / "calls.log"
    log.write_text("")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ROOT": str(root), "LOG": str(log)}
    result = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return log.read_text() if log.exists() else ""


def test_setup_script_leaves_a_runs_folder_the_non_root_task_user_can_write():
    # Outside pytest's per-user temp root (mode 0700), so the other uid can reach the folder.
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        root.chmod(0o755)
        _check_runs_folder(root)


def _check_runs_folder(root: Path) -> None:
    calls = _run_setup_script(root, 2)
    assert "mdadm --create" in calls and "mkfs" in calls
    runs = root / "data" / "runs"
    assert oct(runs.stat().st_mode & 0o7777) == "0o1777"
    if os.geteuid() == 0:
        # The task user: any uid but root (the export squashes root anyway).
        made = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "mkdir", "-p", str(runs / "dev" / "run1" / "checkpoints")],
            capture_output=True, text=True,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
    # A second boot with the same (re-attached) disks formats nothing.
    again = _run_setup_script(root, 2)
    assert "mkfs" not in again and "mdadm --create" not in again
