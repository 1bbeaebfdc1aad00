# shellcheck shell=bash
# Part of the node's check (node_check.sh) on a GPU size: every GPU listed, on a driver new
# enough for the image's CUDA, and healthy.
#
# A GPU that passes the count but is sick: uncorrectable ECC errors since the driver loaded, a
# row remapping the GPU waits for (a reset) or one that failed, and a critical Xid in the kernel
# log since boot; azurehpc-health-checks customTests/azure_gpu_ecc.nhc fails a node on the
# first two. "[N/A]" (ECC off, no row remapping on the GPU) is not a fault. The check runs as
# the node's admin, so dmesg can be read. `sed -n 1p` rather than `head -n 1`: head exits
# early, and under pipefail the writer's SIGPIPE fails the node.
# shellcheck disable=SC2170  # __GPUS__ is a number once filled

n=$(nvidia-smi -L | grep -c '^GPU ' || true)
[ "$n" -eq __GPUS__ ] || fail "expected __GPUS__ GPUs, nvidia-smi lists $n"
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | sed -n 1p)
oldest=$(printf '%s\n' __MIN_DRIVER__ "$driver" | sort -V | sed -n 1p)
[ "$oldest" = __MIN_DRIVER__ ] ||
  fail "NVIDIA driver $driver is older than __MIN_DRIVER__, which the image's CUDA __CUDA__ needs;" \
    "use a newer pool image"
while IFS=', ' read -r index ecc; do
  case "$ecc" in ''|*[!0-9]*) continue ;; esac
  [ "$ecc" -eq 0 ] || fail "GPU $index: $ecc uncorrectable ECC errors since boot;" \
    "this node's GPU memory is failing"
done < <(nvidia-smi --query-gpu=index,ecc.errors.uncorrected.volatile.total \
  --format=csv,noheader)
remap=gpu_bus_id,remapped_rows.pending,remapped_rows.failure
while IFS=', ' read -r bus pending failed; do
  case "$pending" in 1|Yes) fail "GPU $bus: a row remapping is pending (it needs a reset)" ;; esac
  case "$failed" in 1|Yes) fail "GPU $bus: a row remapping failed (it needs replacing)" ;; esac
done < <(nvidia-smi --query-remapped-rows="$remap" --format=csv,noheader)
critical='__CRITICAL_XIDS__'
xid=$(dmesg 2>/dev/null | grep -E "NVRM: Xid \([^)]*\): ($critical)," | sed -n 1p || true)
[ -z "$xid" ] || fail "GPU Xid error in the kernel log since boot: ${xid#*NVRM: }"
