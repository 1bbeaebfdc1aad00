"""``make bench``: every benchmark in turn, results to bench/results/*.json, then the plots, then
the performance goals beside what this run measured (``bench.goals``). Figures are printed side
by side within each benchmark (these machines are noisy)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench import goals
from bench.common import REPO

BENCHMARKS = (
    ("bench.overhead", []),
    ("bench.scaling", []),
    ("bench.allreduce", []),
    ("bench.data_path", []),
    ("bench.cache_memory", []),
    ("bench.checkpoint_io", []),
    ("bench.checkpoint_stall", []),
    ("bench.engine_memory", []),
    ("bench.lm_throughput", []),
    ("bench.program_eval", []),
    ("bench.code_change", []),
    ("bench.image_pull", []),
    ("bench.gpu", []),
    ("bench.plots", []),
)


def main() -> int:
    started = time.time()
    for module, args in BENCHMARKS:
        print(f"\n== {module}", flush=True)
        result = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO)
        if result.returncode != 0:
            print(f"{module} failed with exit code {result.returncode}", file=sys.stderr)
            return result.returncode
    print("\n== goals (from this run's results)", flush=True)
    print(goals.report(goals.goals(since=started)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
