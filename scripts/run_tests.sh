#!/usr/bin/env bash
# make test's three passes, every test in exactly one (tests/ci/test_workflows.py checks it):
# - the tests that start no multi-process run, on both cores at once;
# - beside them, the Batch node emulator's jobs (marked `emulator`), one at a time: they wait on
#   emulated NFS delays, polls and the platform far more than they compute (a third of the two
#   cores busy on their own), so the two together take about as long as the first alone;
# - then the other multi-process runs (workers, launchers), one at a time with nothing beside
#   them: each already uses both cores, and many time signals, exits and stalls.
# Every pass runs; the exit status is non-zero when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

one_process=(-n 2 -m "not processes" tests)
emulator=(-m "processes and emulator" tests)
multi_process=(-m "processes and not emulator" tests)

pytest=.venv/bin/pytest
beside_log=$(mktemp)
beside=
# An interrupted run stops the pass beside as Ctrl-C would (pytest then tears its emulated nodes
# down) and leaves no log behind.
stop_beside() {
  if [ -n "$beside" ]; then
    kill -INT "$beside" 2>/dev/null
    wait "$beside"
  fi
  rm -f "$beside_log"
}
trap stop_beside EXIT
trap 'exit 130' INT TERM

echo "the Batch node emulator's jobs run beside the one-process tests; their output follows them"
# A job started with & ignores SIGINT: restore it, so Ctrl-C reaches this pass too.
(trap - INT && exec "$pytest" "${emulator[@]}") >"$beside_log" 2>&1 &
beside=$!
"$pytest" "${one_process[@]}"
failed=$?
wait "$beside"
status=$?
beside=
echo "--- the Batch node emulator's jobs (pytest ${emulator[*]}):"
cat "$beside_log"
[ "$status" -eq 0 ] || failed=1
"$pytest" "${multi_process[@]}" || failed=1
exit $((failed != 0))
