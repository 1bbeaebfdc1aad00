#!/usr/bin/env bash
# make test: lint and two passes of tests, every test in exactly one (tests/ci/test_workflows.py
# checks it), run at the same time:
# - the tests marked `processes` (real multi-process runs: workers, launchers, emulated nodes),
#   one at a time and at normal priority: each uses both cores, and many time signals, exits and
#   stalls, so nothing may take a core from them;
# - beside them, at the lowest CPU priority, `make lint` and then the tests that start no
#   multi-process run, on both cores: they only get the cores the runs leave idle (about 40%:
#   the runs wait on rendezvous, polls, emulated NFS delays and the platform), so the three take
#   about as long as the runs alone. Their output follows the runs'. Lowest means nice 19 for a
#   session of their own whose autogroup is set to nice 19 too: where the kernel groups
#   processes by session (autogroup, sched(7)), a process's nice value only weighs against its
#   own session's, and the runs' processes live in sessions of their own.
# Everything runs to the end; the exit status is non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."

# Both passes at once keep more threads wanting a core than there are cores. torch's OpenMP
# threads (GNU libgomp) spin up to 300,000 times at each barrier before they sleep when
# OMP_WAIT_POLICY is unset (libgomp's manual, GOMP_SPINCOUNT, read 2026-11-29), CPU the other
# pass then lacks; PASSIVE makes a waiting thread sleep at once. It changes how threads wait,
# never what they compute. Every test process and what it starts inherits it.
export OMP_WAIT_POLICY=PASSIVE

processes=(-m processes tests)
one_process=(-n 2 -m "not processes" tests)

pytest=.venv/bin/pytest

# The pass beside, started below as this script with --beside in a session of its own at nice 19.
if [ "${1:-}" = --beside ]; then
  echo 19 2>/dev/null >"/proc/$$/autogroup"
  make --no-print-directory lint
  linted=$?
  "$pytest" "${one_process[@]}"
  tested=$?
  exit $((linted != 0 || tested != 0))
fi

beside_log=$(mktemp)
beside=
# An interrupted run stops the pass beside as Ctrl-C would stop it in a terminal (SIGINT to its
# whole session: pytest, its workers and what they started), and leaves no log behind.
stop_beside() {
  if [ -n "$beside" ]; then
    kill -INT -- "-$beside" 2>/dev/null
    wait "$beside"
    kill -TERM -- "-$beside" 2>/dev/null
  fi
  rm -f "$beside_log"
}
trap stop_beside EXIT
trap 'exit 130' INT TERM

echo "lint and the tests that start no multi-process run go beside these, at the lowest priority; their output follows"
# setsid does not fork here (this subshell leads no process group), so $! is the pass's bash,
# and the leader of its session and process group.
(exec setsid nice -n 19 bash scripts/run_tests.sh --beside) >"$beside_log" 2>&1 &
beside=$!
"$pytest" "${processes[@]}"
failed=$?
wait "$beside"
status=$?
beside=
echo "--- make lint, then the tests that start no multi-process run (pytest ${one_process[*]}), beside the above:"
cat "$beside_log"
[ "$status" -eq 0 ] || failed=1
exit $((failed != 0))
