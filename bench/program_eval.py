"""How long the Pulumi program takes to evaluate under mocks (a benchmark: prints, asserts nothing).

    .venv/bin/python bench/program_eval.py [--repeat 5]

Each stack is evaluated ``repeat`` times in one process after one warm-up run (imports of
pulumi_azure_native dominate a cold start); the median and range are printed side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.plan import REPO, evaluate, read_stack_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    stacks = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in REPO.glob("Pulumi.*.yaml"))
    started = time.perf_counter()
    evaluate(stacks[0], read_stack_file(REPO / f"Pulumi.{stacks[0]}.yaml"))
    print(f"cold first evaluation (imports included): {time.perf_counter() - started:.2f} s")
    print(f"{'stack':<16}{'resources':>10}{'median s':>10}{'min s':>8}{'max s':>8}")
    for stack in stacks:
        values = read_stack_file(REPO / f"Pulumi.{stack}.yaml")
        times, count = [], 0
        for _ in range(args.repeat):
            started = time.perf_counter()
            plan = evaluate(stack, values)
            times.append(time.perf_counter() - started)
            count = len(plan.resources)
        print(
            f"{stack:<16}{count:>10}{statistics.median(times):>10.3f}{min(times):>8.3f}"
            f"{max(times):>8.3f}"
        )


if __name__ == "__main__":
    main()
