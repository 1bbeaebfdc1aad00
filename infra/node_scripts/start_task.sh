# shellcheck shell=bash
# The pool's start task (infra/node_checks.py fills it; docs/internals.md says how), run by
# Batch as the node's admin before the node takes a task, and again after each restart.
#
# It refuses a node that kept itself out of the pool (the watcher's record), writes the node's
# check (node_check.sh) and the watcher (node_watch.sh) to the node's OS disk, runs the check
# (waiting for InfiniBand ports), mounts the local NVMe array (nvme_array.sh, on the sizes that
# have one), makes the jobs' shared runs folder and starts the watcher.
#
# The runs folder, for the non-admin task user (see infra/cloud_init.py): the pool's file
# systems are mounted when a node joins the pool, before its start task runs
# (articles/batch/virtual-file-mount.md). On the NFS VM cloud-init made the folder; an Azure
# Files share starts empty and root-owned, and this task runs as root (the share does not
# squash it). Not fatal: the launcher checks the folder is writable before any worker starts
# and names the fix.
#
# The watcher runs out of the start task's process tree, so Batch can rerun the task ("avoid
# start tasks which create breakaway process or install/launch services from the start task
# working directory", StartTask's remarks): a transient unit, stopped first because a start task
# may run again without a restart. A node without one runs on, unguarded, and says so.

set -euo pipefail
fail() { echo "start task: $*" >&2; exit 1; }
[ ! -s __KEPT_OUT__ ] || fail "this node kept itself out of the pool: $(cat __KEPT_OUT__);" \
  "remove it from the pool (az batch node delete --pool-id $AZ_BATCH_POOL_ID" \
  "--node-list $AZ_BATCH_NODE_ID, as Owner or Contributor of the stack: it needs" \
  "pools/write, which the team's Azure Batch Job Submitter role does not hold)"
mkdir -p __STATE_DIR__ && chmod 755 __STATE_DIR__
cat > __STATE_DIR__/node-check.new <<'CHECK'
__NODE_CHECK__
CHECK
cat > __STATE_DIR__/node-watch.new <<'WATCH'
__NODE_WATCH__
WATCH
mv -f __STATE_DIR__/node-check.new __STATE_DIR__/node-check
mv -f __STATE_DIR__/node-watch.new __STATE_DIR__/node-watch
{ reason=$(bash __STATE_DIR__/node-check --wait 2>&1 1>&3 3>&-); } 3>&1 || fail "$reason"
__NVME_ARRAY__
runs="$AZ_BATCH_NODE_MOUNTS_DIR/__NFS_RELATIVE_MOUNT__/__RUNS_DIR__"
if [ ! -d "$runs" ] || [ "$(stat -c %a "$runs")" != __RUNS_MODE__ ]; then
  mkdir -p "$runs" && chmod __RUNS_MODE__ "$runs" ||
    echo "start task: cannot make $runs mode __RUNS_MODE__" >&2
fi
systemctl stop __WATCH_UNIT__ 2>/dev/null || true
systemd-run --quiet --collect --unit=__WATCH_UNIT__ \
  --setenv=AZ_BATCH_NODE_ROOT_DIR="$AZ_BATCH_NODE_ROOT_DIR" \
  /bin/bash __STATE_DIR__/node-watch ||
  echo "start task: cannot start __WATCH_UNIT__: a sick node will not keep itself out" >&2
