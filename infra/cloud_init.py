"""The NFS server's cloud-init document and the readiness gate that waits for it, rendered by
pure functions (the document is validated in tests with ``cloud-init schema``, the gate run in
bash with stub tools). The setup script and the gate are files in infra/node_scripts/
(nfs_setup.sh, nfs_ready.sh), filled here; nfs_setup.sh says how the setup keeps the data of
re-attached disks.
"""

from __future__ import annotations

import yaml

from infra.node_scripts import in_bash, render

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
    """The server's cloud-init document: its packages, the setup script
    (node_scripts/nfs_setup.sh), the export and the server's threads."""
    setup = render(
        "nfs_setup.sh",
        DISKS=" ".join(f"/dev/disk/azure/data/by-lun/{lun}" for lun in range(disk_count)),
        LABEL=LABEL,
        MOUNT_POINT=MOUNT_POINT,
        RUNS_DIR=RUNS_DIR,
        RUNS_MODE=RUNS_MODE,
        READY_DIR=READY_MARKER.rsplit("/", 1)[0],
        READY_MARKER=READY_MARKER,
    )
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


def render_ready_gate(
    *,
    cloud_init_wait_s: int = CLOUD_INIT_WAIT_SECONDS,
    marker_attempts: int = MARKER_ATTEMPTS,
    marker_poll_s: int = MARKER_POLL_SECONDS,
) -> str:
    """The gate (node_scripts/nfs_ready.sh, which says what it checks and why): exits 0 when
    the server exports a ready ``/data``; otherwise 1 with one line on stderr saying what is
    missing."""
    return render(
        "nfs_ready.sh",
        CLOUD_INIT_WAIT_SECONDS=cloud_init_wait_s,
        MARKER_ATTEMPTS=marker_attempts,
        MARKER_POLL_SECONDS=marker_poll_s,
        MARKER_WAIT_SECONDS=marker_attempts * marker_poll_s,
        READY_MARKER=READY_MARKER,
        MOUNT_POINT=MOUNT_POINT,
        RUNS_DIR=RUNS_DIR,
        RUNS_MODE=RUNS_MODE,
    )


def ready_command(gate: str | None = None) -> str:
    """The extension's ``commandToExecute``: the gate in bash (``infra.node_scripts.in_bash``
    says how the handler runs it)."""
    return in_bash(render_ready_gate() if gate is None else gate)
