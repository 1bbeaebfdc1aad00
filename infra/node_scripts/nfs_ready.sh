# shellcheck shell=bash
# The NFS server's readiness gate (infra/cloud_init.py fills it; the VM's CustomScript
# extension runs it): exits 0 when the server exports a ready __MOUNT_POINT__; otherwise 1 with
# one line on stderr saying what is missing.
#
# `cloud-init status` exits 0 (done), 1 (unrecoverable error) or 2 (recoverable error: "done,
# degraded"; docs.cloud-init.io, explanation/failure_states.html, "Cloud-init error codes").
# Ubuntu 24.04 on Azure finishes degraded when the IMDS answers only on a retry
# (canonical/cloud-init #5323), so `cloud-init status --wait` alone fails a good boot. The gate
# lets 2 through and then checks what the nodes need: the setup's marker (nfs_setup.sh's last
# step), the export, the runs folder and its mode. `exportfs` lists one export per line, the
# path first (nfs-utils, exportfs.c, dump()).

set -u
fail() { echo "nfs-ready: $*" >&2; exit 1; }
timeout __CLOUD_INIT_WAIT_SECONDS__ cloud-init status --wait
status=$?
case $status in
  0|2) ;;
  124) fail "cloud-init still running after __CLOUD_INIT_WAIT_SECONDS__ s; see cloud-init status --long" ;;
  *) fail "cloud-init failed (status exit $status); see cloud-init status --long" ;;
esac
marker=__READY_MARKER__ log=/var/log/cloud-init-output.log
for _ in $(seq 1 __MARKER_ATTEMPTS__); do [ -e "$marker" ] && break; sleep __MARKER_POLL_SECONDS__; done
[ -e "$marker" ] || fail "setup unfinished: no $marker after __MARKER_WAIT_SECONDS__ s; see $log"
exportfs | grep -Eq "^__MOUNT_POINT__([[:space:]]|\$)" || fail "__MOUNT_POINT__ is not exported"
mode=$(stat -c %a __MOUNT_POINT__/__RUNS_DIR__ 2>/dev/null) || fail "__MOUNT_POINT__/__RUNS_DIR__ is missing"
[ "$mode" = __RUNS_MODE__ ] || fail "__MOUNT_POINT__/__RUNS_DIR__ has mode $mode, not __RUNS_MODE__"
echo "nfs-ready: __MOUNT_POINT__ exported, cloud-init status $status"
