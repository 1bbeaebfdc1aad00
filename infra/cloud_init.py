"""The NFS server's cloud-init document, rendered by a pure function (validated in tests with
``cloud-init schema``).

It never reformats existing data: an array that assembles is reused, and a filesystem is made
only when no device carries the ``nfsdata`` label, so re-attached disks (the VM was replaced,
the disks were protected) come back with their data.
"""

from __future__ import annotations

import yaml

MOUNT_POINT = "/data"
LABEL = "nfsdata"
# Where the training jobs write (checkpoints, metrics, logs). Tasks run as Batch's non-admin
# auto-user, whose uid the server cannot know, and the export squashes root: so the folder is
# world-writable with the sticky bit (like /tmp: everyone creates, only owners delete).
RUNS_DIR = "runs"
RUNS_MODE = "1777"


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
"""
    document = {
        "package_update": True,
        "packages": ["nfs-kernel-server", "mdadm"],
        "write_files": [
            {"path": "/usr/local/sbin/setup-nfs-data", "permissions": "0755", "content": setup},
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
        "runcmd": [
            ["/usr/local/sbin/setup-nfs-data"],
            ["systemctl", "enable", "--now", "nfs-kernel-server"],
            ["exportfs", "-ra"],
        ],
    }
    return "#cloud-config\n" + yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=100)


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, so the script reads as a script on the VM."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _represent_str)
