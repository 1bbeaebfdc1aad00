"""What a pool node checks about itself, and how a sick node keeps itself out of the pool.

The start task (as the node's admin) writes the node's check to STATE_DIR and runs it: every GPU
on a new enough driver and healthy, no failed file system, the size's InfiniBand ports active;
a node that fails never receives a task. It then leaves a watcher running (a systemd unit):
when a launcher on the node asks after a failed try (trainer/launch/recheck.py), the watcher
runs the check again, and a node that fails it now records why in KEPT_OUT and restarts. The
start task that runs after the restart refuses any node with that record, so Batch gives it no
task again until it is removed from the pool. docs/jobs.md, A node that fails, says why this
and not the pool's rights on the nodes.
"""

from __future__ import annotations

import shlex

from infra.batch import NFS_RELATIVE_MOUNT, NVME_DEVICE, NVME_ROOT
from infra.cloud_init import RUNS_DIR, RUNS_MODE
from infra.toolchain import CUDA, MIN_DRIVER
from trainer.launch.recheck import RECORD_SECONDS, REQUEST, VERDICT

# What the start task prints on the CPU acceptance size (0 GPUs): the skip is visible in each
# node's startup/stdout.txt, never silent.
CPU_SKIP_MESSAGE = "node ok: CPU acceptance profile, GPU and InfiniBand checks skipped"

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
    """The start task: refuse a node that kept itself out; write and run the node's check
    (waiting for InfiniBand ports); mount the local NVMe array (``nvme_disks`` of them, 0 for
    none); make the shared runs folder; start the watcher.

    A size without GPUs (the CPU acceptance size, ``infra.sizes.CPU_ACCEPTANCE``) has no driver
    or InfiniBand to check: its check skips those, and the task says so."""
    ok = (
        f'echo "{CPU_SKIP_MESSAGE}"'
        if gpus == 0
        else 'echo "node ok: $n GPUs, driver $driver, $ib active InfiniBand ports"'
    )
    check = f"""set -euo pipefail
fail() {{ echo "$*" >&2; exit 1; }}
{_gpu_checks(gpus) if gpus else ""}{_FILE_SYSTEMS}{_ib_checks(ib_ports) if gpus else ""}{ok}
"""
    script = f"""set -euo pipefail
fail() {{ echo "start task: $*" >&2; exit 1; }}
[ ! -s {KEPT_OUT} ] || fail "this node kept itself out of the pool: $(cat {KEPT_OUT});" \\
  "remove it from the pool (az batch node delete --pool-id $AZ_BATCH_POOL_ID" \\
  "--node-list $AZ_BATCH_NODE_ID, as Owner or Contributor of the stack: it needs" \\
  "pools/write, which the team's Azure Batch Job Submitter role does not hold)"
mkdir -p {STATE_DIR} && chmod 755 {STATE_DIR}
cat > {STATE_DIR}/node-check.new <<'CHECK'
{check}CHECK
cat > {STATE_DIR}/node-watch.new <<'WATCH'
{_WATCH}WATCH
mv -f {STATE_DIR}/node-check.new {STATE_DIR}/node-check
mv -f {STATE_DIR}/node-watch.new {STATE_DIR}/node-watch
{{ reason=$(bash {STATE_DIR}/node-check --wait 2>&1 1>&3 3>&-); }} 3>&1 || fail "$reason"
{_nvme_array(nvme_disks) if nvme_disks else ""}{_RUNS_FOLDER}
{_START_WATCH}"""
    return in_bash(script)


def _gpu_checks(gpus: int) -> str:
    """Every GPU listed, on a driver new enough for the image's CUDA, and healthy."""
    return f"""n=$(nvidia-smi -L | grep -c '^GPU ' || true)
[ "$n" -eq {gpus} ] || fail "expected {gpus} GPUs, nvidia-smi lists $n"
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | sed -n 1p)
oldest=$(printf '%s\\n' {MIN_DRIVER} "$driver" | sort -V | sed -n 1p)
[ "$oldest" = {MIN_DRIVER} ] ||
  fail "NVIDIA driver $driver is older than {MIN_DRIVER}, which the image's CUDA {CUDA} needs;" \\
    "use a newer pool image"
{_GPU_HEALTH}"""


# A GPU that passes the count but is sick: uncorrectable ECC errors since the driver loaded, a
# row remapping the GPU waits for (a reset) or one that failed, and a critical Xid in the kernel
# log since boot; azurehpc-health-checks customTests/azure_gpu_ecc.nhc fails a node on the
# first two. "[N/A]" (ECC off, no row remapping on the GPU) is not a fault. The check runs as
# the node's admin, so dmesg can be read. ``sed -n 1p`` rather than ``head -n 1``: head exits
# early, and under pipefail the writer's SIGPIPE fails the node.
_GPU_HEALTH = f"""while IFS=', ' read -r index ecc; do
  case "$ecc" in ''|*[!0-9]*) continue ;; esac
  [ "$ecc" -eq 0 ] || fail "GPU $index: $ecc uncorrectable ECC errors since boot;" \\
    "this node's GPU memory is failing"
done < <(nvidia-smi --query-gpu=index,ecc.errors.uncorrected.volatile.total \\
  --format=csv,noheader)
remap=gpu_bus_id,remapped_rows.pending,remapped_rows.failure
while IFS=', ' read -r bus pending failed; do
  case "$pending" in 1|Yes) fail "GPU $bus: a row remapping is pending (it needs a reset)" ;; esac
  case "$failed" in 1|Yes) fail "GPU $bus: a row remapping failed (it needs replacing)" ;; esac
done < <(nvidia-smi --query-remapped-rows="$remap" --format=csv,noheader)
critical='{"|".join(map(str, CRITICAL_XIDS))}'
xid=$(dmesg 2>/dev/null | grep -E "NVRM: Xid \\([^)]*\\): ($critical)," | sed -n 1p || true)
[ -z "$xid" ] || fail "GPU Xid error in the kernel log since boot: ${{xid#*NVRM: }}"
"""

# A file system the kernel gave up on since boot: ext4 remounts itself read-only after an I/O
# or metadata error ("Remounting filesystem read-only", fs/ext4/super.c) and XFS shuts down
# ("Shutting down filesystem", fs/xfs/xfs_fsops.c). Tasks on such a node fail whatever they
# run, on every size, the CPU one too.
_FILE_SYSTEMS = """fs=$(dmesg 2>/dev/null |
  grep -E 'Remounting filesystem read-only|Shutting down filesystem' | sed -n 1p || true)
[ -z "$fs" ] || fail "a file system failed since boot: ${fs#*] }"
"""


def _ib_checks(ib_ports: int) -> str:
    """Count the ACTIVE InfiniBand ports until there are ``ib_ports``; with ``--wait`` (the
    start task) poll up to IB_WAIT_SECONDS, then fail in one line naming each port that is not
    ACTIVE and its state. Only ports whose link layer is InfiniBand count: the
    accelerated-networking NIC (mlx5_an0) shows up in /sys/class/infiniband too, with an ACTIVE
    Ethernet port. Any state but ACTIVE is waited on (DOWN too: Azure does not say a port is
    never DOWN while its VF comes up), and the glob is read afresh each time, so a device that
    appears late counts. ``sleep`` is the node's; the tests' stub advances a fake clock."""
    return f"""limit=0
[ "${{1:-}}" != --wait ] || limit={IB_WAIT_SECONDS}
waited=0
while :; do
  ib=0 idle=""
  for port in /sys/class/infiniband/*/ports/*; do
    [ "$(cat "$port/link_layer" 2>/dev/null)" = InfiniBand ] || continue
    state=$(cat "$port/state" 2>/dev/null || echo unreadable)
    case "$state" in
      *ACTIVE*) ib=$((ib + 1)) ;;
      *) idle="$idle, ${{port#/sys/class/infiniband/}} is $state" ;;
    esac
  done
  [ "$ib" -lt {ib_ports} ] && [ "$waited" -lt "$limit" ] || break
  sleep {IB_POLL_SECONDS}
  waited=$((waited + {IB_POLL_SECONDS}))
done
[ "$ib" -ge {ib_ports} ] || fail "expected {ib_ports} active InfiniBand ports, found $ib" \\
  "after waiting $waited s${{idle:+:}}${{idle#,}}"
[ "$waited" -eq 0 ] || echo "InfiniBand ports active after $waited s"
"""


def _nvme_array(disks: int) -> str:
    """The size's local NVMe disks as one RAID0 array with an XFS file system at NVME_ROOT, and
    in it the folders every task user stages datasets and keeps code in (infra/batch.py).

    The HPC image leaves the disks alone (its nvme-raid unit is written, never enabled:
    Azure/azhpc-images customizations/setup_nvme.sh, read 2026-11-28), so this task builds the
    array as that unit would (RAID0 of every /dev/nvme*n1, XFS), without erasing one that holds
    data: mounted already (this task run again in the same boot), it is left as it is; after a
    restart the disks keep their data and the kernel assembles their array again at boot under
    a number of its own (mdadm(8), --incremental), which is found through the first disk's
    holder and mounted; disks that carry a superblock but no running array are assembled; only
    blank disks (a new, redeployed or preempted VM: the local disks' data is lost,
    scheduled-events.md) get a new array and file system. The disks are found by lsblk, as
    /dev/nvme*n1 whole disks: the OS and temporary disks of these sizes are SCSI. Any step that
    fails fails the node in one line, with the tool's own first line."""
    return f"""nvme={NVME_ROOT}
if ! mountpoint -q "$nvme"; then
  mapfile -t disks < <(lsblk -dnpo NAME,TYPE |
    awk '$1 ~ "^/dev/nvme[0-9]+n1$" && $2 == "disk" {{print $1}}')
  [ "${{#disks[@]}}" -eq {disks} ] ||
    fail "expected {disks} local NVMe disks, lsblk lists ${{#disks[@]}}"
  md=$(lsblk -lnpo NAME,TYPE "${{disks[0]}}" | awk '$2 == "raid0" {{print $1; exit}}')
  if [ -z "$md" ] && mdadm --examine "${{disks[0]}}" >/dev/null 2>&1; then
    md={NVME_DEVICE}
    out=$(mdadm --assemble "$md" "${{disks[@]}}" 2>&1) ||
      fail "the local NVMe disks hold an array that does not assemble (${{out%%$'\n'*}})"
  elif [ -z "$md" ]; then
    md={NVME_DEVICE}
    out=$(mdadm --create "$md" --level=0 --raid-devices={disks} --run "${{disks[@]}}" 2>&1) ||
      fail "cannot build the local NVMe array (${{out%%$'\n'*}})"
    out=$(mkfs.xfs -f "$md" 2>&1) || fail "cannot make a file system on $md (${{out%%$'\n'*}})"
  fi
  mkdir -p "$nvme"
  out=$(mount "$md" "$nvme" 2>&1) || fail "cannot mount $md at $nvme (${{out%%$'\n'*}})"
fi
mkdir -p "$nvme/datasets" "$nvme/code" && chmod 1777 "$nvme/datasets" "$nvme/code" ||
  fail "cannot make the datasets and code folders on $nvme"
echo "local NVMe array of {disks} disks at $nvme"
"""


# The jobs' shared runs folder, for the non-admin task user (see infra/cloud_init.py). The pool's
# file systems are mounted when a node joins the pool, before its start task runs
# (articles/batch/virtual-file-mount.md). On the NFS VM cloud-init made the folder; an Azure
# Files share starts empty and root-owned, and this task runs as the node's admin (root; the
# share does not squash it). Not fatal: the launcher checks the folder is writable before any
# worker starts and names the fix.
_RUNS_FOLDER = f"""runs="$AZ_BATCH_NODE_MOUNTS_DIR/{NFS_RELATIVE_MOUNT}/{RUNS_DIR}"
if [ ! -d "$runs" ] || [ "$(stat -c %a "$runs")" != {RUNS_MODE} ]; then
  mkdir -p "$runs" && chmod {RUNS_MODE} "$runs" ||
    echo "start task: cannot make $runs mode {RUNS_MODE}" >&2
fi"""

# The watcher, a root loop over the requests in the node's task folders (AZ_BATCH_TASK_DIR is
# workitems/<job>/job-1/<task>: batch-compute-node-environment-variables.md). Root only removes
# a request (never reads it) and answers as the folder's owner (setpriv), so nothing a task user
# leaves there makes root write or read anywhere. The check runs under timeout with its stderr in
# a file: a hung nvidia-smi (a GPU fallen off the bus) holds no pipe open. A node that fails is
# recorded in KEPT_OUT first (if its disk refuses, the answer says so and it stays up), then
# answered; once the launcher took the answer (or RECORD_SECONDS passed) the node restarts. A
# restart with a task on the node is a recovery for Batch, which runs the task again ("Batch
# will retry Tasks when a recovery operation is triggered on a Node ... when an unhealthy Node
# is rebooted", BatchTask's remarks), and the start task then finds the record.
_WATCH = f"""set -uo pipefail
shopt -s nullglob
answer() {{
  printf '%s\\n' "$*" |
    setpriv --reuid="$(stat -c %u "$folder")" --regid="$(stat -c %g "$folder")" \\
      --clear-groups sh -c 'f=$(mktemp -p "$1") && cat > "$f" && mv -f "$f" "$1/{VERDICT}"' \\
      sh "$folder"
}}
while sleep 1; do
  for request in "$AZ_BATCH_NODE_ROOT_DIR"/workitems/*/*/*/{REQUEST}; do
    folder=${{request%/*}}
    rm -f "$request" || continue
    timeout -k 5 {CHECK_TIMEOUT_SECONDS} bash {STATE_DIR}/node-check >/dev/null \\
      2>{STATE_DIR}/reason
    case $? in
      0) answer ok; continue ;;
      124|137) reason="its checks did not finish in {CHECK_TIMEOUT_SECONDS} s" ;;
      *) reason=$(cat {STATE_DIR}/reason); reason=${{reason//$'\\n'/; }} ;;
    esac
    if ! {{ printf '%s since %s\\n' "$reason" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \\
        > {KEPT_OUT}.new && mv -f {KEPT_OUT}.new {KEPT_OUT}; }}; then
      answer unrecorded "$reason"
      continue
    fi
    answer sick "$reason"
    for _ in $(seq {RECORD_SECONDS}); do [ -e "$folder/{VERDICT}" ] && sleep 1 || break; done
    systemctl reboot
    exit 0
  done
done
"""

# Out of the start task's process tree, so Batch can rerun the task ("avoid start tasks which
# create breakaway process or install/launch services from the start task working directory",
# StartTask's remarks): a transient unit, stopped first because a start task may run again
# without a restart. A node without one runs on, unguarded, and says so.
_START_WATCH = f"""systemctl stop {WATCH_UNIT} 2>/dev/null || true
systemd-run --quiet --collect --unit={WATCH_UNIT} \\
  --setenv=AZ_BATCH_NODE_ROOT_DIR="$AZ_BATCH_NODE_ROOT_DIR" \\
  /bin/bash {STATE_DIR}/node-watch ||
  echo "start task: cannot start {WATCH_UNIT}: a sick node will not keep itself out" >&2
"""


def in_bash(script: str) -> str:
    """A Batch command line for ``script``: Batch runs command lines without a shell, so bash
    gets the script as one argument, quoted so any quote inside survives."""
    return f"/bin/bash -c {shlex.quote(script)}"
