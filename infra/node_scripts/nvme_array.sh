# shellcheck shell=bash
# Part of the start task (start_task.sh) on a size with local NVMe disks: the size's
# __NVME_DISKS__ disks as one RAID0 array with an XFS file system at __NVME_ROOT__, and in it
# the folders every task user stages datasets and keeps code in (infra/batch.py).
#
# The HPC image leaves the disks alone (its nvme-raid unit is written, never enabled:
# Azure/azhpc-images customizations/setup_nvme.sh, read 2026-11-28), so this builds the array as
# that unit would (RAID0 of every /dev/nvme*n1, XFS), without erasing one that holds data:
# mounted already (the start task run again in the same boot), it is left as it is; after a
# restart the disks keep their data and the kernel assembles their array again at boot under a
# number of its own (mdadm(8), --incremental), which is found through the first disk's holder
# and mounted; disks that carry a superblock but no running array are assembled; only blank
# disks (a new, redeployed or preempted VM: the local disks' data is lost,
# scheduled-events.md) get a new array and file system. The disks are found by lsblk, as
# /dev/nvme*n1 whole disks: the OS and temporary disks of these sizes are SCSI. Any step that
# fails fails the node in one line, with the tool's own first line.
# shellcheck disable=SC2170  # __NVME_DISKS__ is a number once filled
# shellcheck disable=SC2015  # a failed mkdir or chmod fails the node: meant

nvme=__NVME_ROOT__
if ! mountpoint -q "$nvme"; then
  mapfile -t disks < <(lsblk -dnpo NAME,TYPE |
    awk '$1 ~ "^/dev/nvme[0-9]+n1$" && $2 == "disk" {print $1}')
  [ "${#disks[@]}" -eq __NVME_DISKS__ ] ||
    fail "expected __NVME_DISKS__ local NVMe disks, lsblk lists ${#disks[@]}"
  md=$(lsblk -lnpo NAME,TYPE "${disks[0]}" | awk '$2 == "raid0" {print $1; exit}')
  if [ -z "$md" ] && mdadm --examine "${disks[0]}" >/dev/null 2>&1; then
    md=__NVME_DEVICE__
    out=$(mdadm --assemble "$md" "${disks[@]}" 2>&1) ||
      fail "the local NVMe disks hold an array that does not assemble (${out%%$'\n'*})"
  elif [ -z "$md" ]; then
    md=__NVME_DEVICE__
    out=$(mdadm --create "$md" --level=0 --raid-devices=__NVME_DISKS__ --run "${disks[@]}" 2>&1) ||
      fail "cannot build the local NVMe array (${out%%$'\n'*})"
    out=$(mkfs.xfs -f "$md" 2>&1) || fail "cannot make a file system on $md (${out%%$'\n'*})"
  fi
  mkdir -p "$nvme"
  out=$(mount "$md" "$nvme" 2>&1) || fail "cannot mount $md at $nvme (${out%%$'\n'*})"
fi
mkdir -p "$nvme/datasets" "$nvme/code" && chmod 1777 "$nvme/datasets" "$nvme/code" ||
  fail "cannot make the datasets and code folders on $nvme"
echo "local NVMe array of __NVME_DISKS__ disks at $nvme"
