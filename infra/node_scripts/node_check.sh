# shellcheck shell=bash
# The node's check, written by the start task to the node's OS disk and run by it (with --wait:
# InfiniBand ports are waited for) and by the watcher after a failed try (without). It exits 1
# with one line on stderr naming what is wrong; on a GPU size gpu_checks.sh and ib_checks.sh are
# filled in, on the CPU acceptance size (no driver, no InfiniBand) neither, and the line it
# prints when it passes says so.
#
# A file system the kernel gave up on since boot: ext4 remounts itself read-only after an I/O
# or metadata error ("Remounting filesystem read-only", fs/ext4/super.c) and XFS shuts down
# ("Shutting down filesystem", fs/xfs/xfs_fsops.c). Tasks on such a node fail whatever they
# run, on every size, the CPU one too.

set -euo pipefail
fail() { echo "$*" >&2; exit 1; }
__GPU_CHECKS__
fs=$(dmesg 2>/dev/null |
  grep -E 'Remounting filesystem read-only|Shutting down filesystem' | sed -n 1p || true)
[ -z "$fs" ] || fail "a file system failed since boot: ${fs#*] }"
__IB_CHECKS__
echo "__NODE_OK__"
