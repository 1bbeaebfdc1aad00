"""The NFS server's cloud-init document and the readiness gate that waits for it, rendered by
pure functions (the document is validated in tests with ``cloud-init schema``, the gate run in
bash with stub tools).

It never reformats existing data: an array that assembles is reused, and a filesystem is made
only when no device carries the ``nfsdata`` label, so re-attached disks (the VM was replaced,
the disks were protected) come back with their data.
"""

from __future__ import annotations

import shlex

import yaml

MOUNT_POINT = "/data"
LABEL = "nfsdata"
# Where the training jobs write (checkpoints, metrics, logs). Tasks run as Batch's non-admin
# auto-user, whose uid the server cannot know, and the export squashes root: so the folder is
# world-writable with the sticky bit (like /tmp: everyone creates, only owners delete).
RUNS_DIR = "runs"
RUNS_MODE = "1777"
SETUP_SCRIPT = "/usr/local/sbin/setup-nfs-data"
# Written by the setup script as its last step, on the OS disk: a replaced VM starts without it,
# while /data is the re-attached disks, which keep an old VM's files.
READY_MARKER = "/var/lib/nfs-setup/ready"
# The gate's bounds: cloud-init installs two packages and makes a filesystem (minutes); once it
# is done the marker is there or never will be, so the grace after it is short.
CLOUD_INIT_WAIT_SECONDS = 1800
MARKER_ATTEMPTS = 12
MARKER_POLL_SECONDS = 5


def render_nfs_cloud_init(disk_count: int, export_cidr: str) -> str:
    disks = " ".join(f"/dev/disk/azure/data/by-lun/{lun}" for lun in range(disk_count))
    setup = f"""#!/bin/bash
set -euo pipefail
disks=({disks})
for disk in "${{disks[@]}}"; do
  for _ in $(seq 1 60); do [ -e "$disk" ] && break; sleep 5; done
  [ -e "$disk" ] || {{ echo "data disk $disk never appeared" >&2; exit 1; }}
done
mdadm --assemble --scan || true
if ! blkid -L {LABEL} >/dev/null 2>&1; then
  if [ ${{#disks[@]}} -gt 1 ]; then
    [ -e /dev/md/{LABEL} ] || mdadm --create /dev/md/{LABEL} --run --level=0 \\
      --raid-devices=${{#disks[@]}} "${{disks[@]}}"
    mkfs.ext4 -L {LABEL} -E lazy_itable_init=1 /dev/md/{LABEL}
  else
    mkfs.ext4 -L {LABEL} "${{disks[0]}}"
  fi
fi
mdadm --detail --scan > /etc/mdadm/mdadm.conf || true
mkdir -p {MOUNT_POINT}
grep -q "LABEL={LABEL}" /etc/fstab || \\
  echo "LABEL={LABEL} {MOUNT_POINT} ext4 defaults,noatime,nofail 0 2" >> /etc/fstab
mount -a
chmod 0775 {MOUNT_POINT}
mkdir -p {MOUNT_POINT}/{RUNS_DIR}
chmod {RUNS_MODE} {MOUNT_POINT}/{RUNS_DIR}
systemctl enable --now nfs-kernel-server
exportfs -ra
# Last, and only when every step above succeeded (set -e): the readiness gate waits for it.
mkdir -p {READY_MARKER.rsplit("/", 1)[0]}
touch {READY_MARKER}
"""
    document = {
        "package_update": True,
        "packages": ["nfs-kernel-server", "mdadm"],
        "write_files": [
            {"path": SETUP_SCRIPT, "permissions": "0755", "content": setup},
            {
                "path": "/etc/exports",
                "permissions": "0644",
                "content": f"{MOUNT_POINT} {export_cidr}(rw,sync,no_subtree_check,root_squash)\n",
            },
            {
                # Many training nodes read at once: more server threads than the default 8.
                "path": "/etc/nfs.conf.d/threads.conf",
                "permissions": "0644",
                "content": "[nfsd]\nthreads=64\n",
            },
        ],
        # One command: runcmd's lines run as one /bin/sh script without -e, whose status is the
        # last line's, so a failed setup followed by a good `exportfs -ra` reported success
        # (canonical/cloud-init #7037). The setup script runs with -e and exports last.
        "runcmd": [[SETUP_SCRIPT]],
    }
    return "#cloud-config\n" + yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=100)


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, so the script reads as a script on the VM."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _represent_str)


# ---- the readiness gate: the NFS VM's CustomScript extension runs it --------------------------
# `cloud-init status` exits 0 (done), 1 (unrecoverable error) or 2 (recoverable error: "done,
# degraded"; docs.cloud-init.io, explanation/failure_states.html, "Cloud-init error codes").
# Ubuntu 24.04 on Azure finishes degraded when the IMDS answers only on a retry
# (canonical/cloud-init #5323), so `cloud-init status --wait` alone fails a good boot. The gate
# lets 2 through and then checks what the nodes need: the setup's marker, the export, the runs
# folder and its mode.


def render_ready_gate(
    *,
    cloud_init_wait_s: int = CLOUD_INIT_WAIT_SECONDS,
    marker_attempts: int = MARKER_ATTEMPTS,
    marker_poll_s: int = MARKER_POLL_SECONDS,
) -> str:
    """The gate as a bash script: exits 0 when the server exports a ready ``/data``; otherwise
    1 with one line on stderr saying what is missing."""
    runs = f"{MOUNT_POINT}/{RUNS_DIR}"
    marker_wait = marker_attempts * marker_poll_s
    # `exportfs` lists one export per line, the path first (nfs-utils, exportfs.c, dump()).
    return f"""set -u
fail() {{ echo "nfs-ready: $*" >&2; exit 1; }}
timeout {cloud_init_wait_s} cloud-init status --wait
status=$?
case $status in
  0|2) ;;
  124) fail "cloud-init still running after {cloud_init_wait_s} s; see cloud-init status --long" ;;
  *) fail "cloud-init failed (status exit $status); see cloud-init status --long" ;;
esac
marker={READY_MARKER} log=/var/log/cloud-init-output.log
for _ in $(seq 1 {marker_attempts}); do [ -e "$marker" ] && break; sleep {marker_poll_s}; done
[ -e "$marker" ] || fail "setup unfinished: no $marker after {marker_wait} s; see $log"
exportfs | grep -Eq "^{MOUNT_POINT}([[:space:]]|\\$)" || fail "{MOUNT_POINT} is not exported"
mode=$(stat -c %a {runs} 2>/dev/null) || fail "{runs} is missing"
[ "$mode" = {RUNS_MODE} ] || fail "{runs} has mode $mode, not {RUNS_MODE}"
echo "nfs-ready: {MOUNT_POINT} exported, cloud-init status $status"
"""


def ready_command(gate: str | None = None) -> str:
    """The extension's ``commandToExecute``. The handler runs it with ``/bin/sh -c`` (older
    releases) or ``/bin/bash -c`` (Azure/custom-script-extension-linux, ``main/exec.go``): one
    quoted word for bash reads the same under both."""
    return "/bin/bash -c " + shlex.quote(render_ready_gate() if gate is None else gate)
