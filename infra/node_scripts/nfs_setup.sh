#!/bin/bash
# The NFS server's setup, which cloud-init writes to the VM and runs once (infra/cloud_init.py
# fills it): wait for the data disks, make them one ext4 file system labelled __LABEL__ (a
# RAID0 array of more than one) and mount it at __MOUNT_POINT__, make the jobs' runs folder,
# export it, and last write the marker the readiness gate (nfs_ready.sh) waits for.
#
# It never reformats existing data: an array that assembles is reused, and a file system is made
# only when no device carries the label, so re-attached disks (the VM was replaced, the disks
# were protected) come back with their data.

set -euo pipefail
disks=(__DISKS__)
for disk in "${disks[@]}"; do
  for _ in $(seq 1 60); do [ -e "$disk" ] && break; sleep 5; done
  [ -e "$disk" ] || { echo "data disk $disk never appeared" >&2; exit 1; }
done
mdadm --assemble --scan || true
if ! blkid -L __LABEL__ >/dev/null 2>&1; then
  if [ ${#disks[@]} -gt 1 ]; then
    [ -e /dev/md/__LABEL__ ] || mdadm --create /dev/md/__LABEL__ --run --level=0 \
      --raid-devices=${#disks[@]} "${disks[@]}"
    mkfs.ext4 -L __LABEL__ -E lazy_itable_init=1 /dev/md/__LABEL__
  else
    mkfs.ext4 -L __LABEL__ "${disks[0]}"
  fi
fi
mdadm --detail --scan > /etc/mdadm/mdadm.conf || true
mkdir -p __MOUNT_POINT__
grep -q "LABEL=__LABEL__" /etc/fstab || \
  echo "LABEL=__LABEL__ __MOUNT_POINT__ ext4 defaults,noatime,nofail 0 2" >> /etc/fstab
mount -a
chmod 0775 __MOUNT_POINT__
mkdir -p __MOUNT_POINT__/__RUNS_DIR__
chmod __RUNS_MODE__ __MOUNT_POINT__/__RUNS_DIR__
systemctl enable --now nfs-kernel-server
exportfs -ra
# Last, and only when every step above succeeded (set -e): the readiness gate waits for it.
mkdir -p __READY_DIR__
touch __READY_MARKER__
