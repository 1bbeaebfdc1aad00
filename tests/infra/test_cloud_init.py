"""The NFS server's user data, checked by the real ``cloud-init schema`` validator."""

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from infra.cloud_init import (
    MARKER_ATTEMPTS,
    MARKER_POLL_SECONDS,
    READY_MARKER,
    SETUP_SCRIPT,
    ready_command,
    render_nfs_cloud_init,
)


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


# `exportfs -ra` makes /etc/exports the kernel's export table; `exportfs` prints that table the
# way nfs-utils' exportfs.c dump() does: the path padded to 14 columns, a path longer than that
# on a line of its own, then the client.
EXPORTFS = r"""
case "${1:-}" in
  -ra) echo "exportfs $*" >> "$LOG"; cp "$ROOT/etc/exports" "$ROOT/exports.active" ;;
  "") [ -f "$ROOT/exports.active" ] || exit 0
      while read -r path spec; do
        if [ ${#path} -gt 14 ]; then printf '%-14s\n\t\t%s\n' "$path" "${spec%%(*}"
        else printf '%-14s\t%s\n' "$path" "${spec%%(*}"; fi
      done < "$ROOT/exports.active" ;;
esac"""

STUBS = {
    # Only the tools that touch disks or services are stubbed; bash runs the rest itself.
    "mdadm": 'echo "mdadm $*" >> "$LOG"; case "$1" in --create) touch "$ROOT/dev/md/nfsdata";; '
    "--detail) echo 'ARRAY /dev/md/nfsdata';; esac",
    "blkid": '[ -f "$ROOT/formatted" ]',
    "mkfs.ext4": 'echo "mkfs $*" >> "$LOG"; touch "$ROOT/formatted"',
    "mount": 'echo "mount $*" >> "$LOG"',
    "systemctl": 'echo "systemctl $*" >> "$LOG"',
    "exportfs": EXPORTFS,
    # `cloud-init status` exits 0 (done), 1 (error) or 2 (done, degraded: a recoverable error),
    # docs.cloud-init.io explanation/failure_states.html; Ubuntu 24.04 on Azure finishes
    # degraded when the IMDS answers on a retry (canonical/cloud-init #5323).
    "cloud-init": 'echo "cloud-init $*" >> "$LOG"; echo "status: $CLOUD_INIT_STATUS"; '
    'exit "$CLOUD_INIT_RC"',
    # The gate's polling: counted, never slept.
    "sleep": 'echo "sleep $*" >> "$LOG"',
}
CLOUD_INIT = {0: "done", 1: "error", 2: "done"}


def _relocate(text: str, root: Path) -> str:
    """Move the absolute paths the VM's files use under ``root``. Only paths that start a word:
    /data inside /dev/disk/azure/data/ is not the mount point."""
    return re.sub(r"(?<![\w/])(/dev/|/etc/|/var/|/data)", lambda m: f"{root}{m.group(1)}", text)


def _tools(root: Path, stubs: dict[str, str]) -> dict[str, str]:
    """Write the stub tools under ``root/bin``; returns the environment that finds them first."""
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    log = root / "calls.log"
    if not log.exists():
        log.write_text("")
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "ROOT": str(root), "LOG": str(log)}


def _run_setup_script(root, disk_count: int, stubs=STUBS, check: bool = True) -> str:
    """Run the user data's setup script (and write its /etc/exports) with the absolute paths
    moved under ``root`` and the disk tools stubbed; returns the log of stubbed calls."""
    document = yaml.safe_load(render_nfs_cloud_init(disk_count, "10.20.0.0/20"))
    files = {f["path"]: f["content"] for f in document["write_files"]}
    for folder in ("dev/md", "etc/mdadm"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for lun in range(disk_count):
        disk = root / "dev" / "disk" / "azure" / "data" / "by-lun" / str(lun)
        disk.parent.mkdir(parents=True, exist_ok=True)
        disk.touch()
    (root / "etc" / "fstab").touch()
    (root / "etc" / "exports").write_text(_relocate(files["/etc/exports"], root))
    env = _tools(root, stubs)
    log = Path(env["LOG"])
    log.write_text("")
    result = subprocess.run(
        ["bash", "-c", _relocate(files[SETUP_SCRIPT], root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return log.read_text()


def _run_gate(root: Path, cloud_init_rc: int, command: str | None = None, shell="/bin/sh"):
    """Run the extension's command as the CustomScript handler does (``<shell> -c <command>``,
    Azure/custom-script-extension-linux main/exec.go) with its paths under ``root``."""
    env = _tools(root, STUBS)
    env.update(CLOUD_INIT_RC=str(cloud_init_rc), CLOUD_INIT_STATUS=CLOUD_INIT[cloud_init_rc])
    Path(env["LOG"]).write_text("")
    command = _relocate(ready_command() if command is None else command, root)
    return subprocess.run(
        [shell, "-c", command], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash"])
@pytest.mark.parametrize("cloud_init_rc", [0, 2])
def test_the_gate_passes_a_finished_setup_also_on_a_degraded_boot(tmp_path, cloud_init_rc, shell):
    _run_setup_script(tmp_path, 2)
    gate = _run_gate(tmp_path, cloud_init_rc, shell=shell)
    assert gate.returncode == 0, gate.stderr
    assert f"nfs-ready: {tmp_path}/data exported" in gate.stdout
    assert "cloud-init status --wait" in (tmp_path / "calls.log").read_text()


def test_a_plain_status_wait_fails_the_degraded_boot_the_gate_passes(tmp_path):
    _run_setup_script(tmp_path, 1)
    assert _run_gate(tmp_path, 2, command="cloud-init status --wait").returncode == 2
    assert _run_gate(tmp_path, 2).returncode == 0


def _one_line_failure(gate) -> str:
    assert gate.returncode == 1
    lines = gate.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nfs-ready: "), gate.stderr
    return lines[0]


def test_the_gate_fails_a_cloud_init_error_even_with_the_export_up(tmp_path):
    _run_setup_script(tmp_path, 1)
    reason = _one_line_failure(_run_gate(tmp_path, 1))
    assert "cloud-init failed (status exit 1)" in reason


@pytest.mark.parametrize("cloud_init_rc", [0, 2])
def test_the_gate_fails_when_the_setup_never_finished(tmp_path, cloud_init_rc):
    # mkfs fails: the setup stops there (set -e), before the export and the marker. Done or
    # degraded, cloud-init can report this boot as finished (canonical/cloud-init #7037).
    broken = {**STUBS, "mkfs.ext4": "exit 1"}
    calls = _run_setup_script(tmp_path, 2, stubs=broken, check=False)
    assert "exportfs" not in calls
    gate = _run_gate(tmp_path, cloud_init_rc)
    reason = _one_line_failure(gate)
    assert f"no {tmp_path}{READY_MARKER} after {MARKER_ATTEMPTS * MARKER_POLL_SECONDS} s" in reason
    # Bounded: it polled the marker MARKER_ATTEMPTS times, then gave up.
    sleeps = (tmp_path / "calls.log").read_text().count(f"sleep {MARKER_POLL_SECONDS}")
    assert sleeps == MARKER_ATTEMPTS


@pytest.mark.parametrize(
    ("undo", "reason"),
    [
        (lambda root: (root / "exports.active").unlink(), "/data is not exported"),
        (lambda root: (root / "data" / "runs").chmod(0o755), "/data/runs has mode 755, not 1777"),
        (lambda root: (root / "data" / "runs").rmdir(), "/data/runs is missing"),
    ],
)
def test_the_gate_checks_what_the_nodes_need_beside_the_marker(tmp_path, undo, reason):
    _run_setup_script(tmp_path, 1)
    undo(tmp_path)
    assert _one_line_failure(_run_gate(tmp_path, 0)).endswith(reason)


def test_the_setup_writes_the_marker_last_and_runs_alone(tmp_path):
    calls = _run_setup_script(tmp_path, 1)
    assert calls.index("systemctl enable --now nfs-kernel-server") < calls.index("exportfs -ra")
    assert (tmp_path / READY_MARKER.lstrip("/")).is_file()
    document = yaml.safe_load(render_nfs_cloud_init(1, "10.20.0.0/20"))
    script = next(f["content"] for f in document["write_files"] if f["path"] == SETUP_SCRIPT)
    assert script.rstrip().endswith(f"touch {READY_MARKER}")
    assert script.splitlines()[1] == "set -euo pipefail"
    # runcmd's lines share one script without -e: a second line could hide the setup's failure.
    assert document["runcmd"] == [[SETUP_SCRIPT]]


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
