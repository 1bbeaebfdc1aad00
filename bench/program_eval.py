"""How long the Pulumi program takes to evaluate under mocks, per stack and as pools are added
(a benchmark: prints and saves, asserts nothing).

    .venv/bin/python -m bench.program_eval [--repeat 5] [--pools 1,2,5,10]

Each case is evaluated ``repeat`` times in one process after one warm-up run (imports of
pulumi_azure_native dominate a cold start); the median and range are printed side by side.
The pool series evaluates the dev stack with the GPU cluster component declared N times (a
Batch account and pool each), which is how a program with N pools grows.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager

from bench.common import save
from dt_commands.plan import REPO, Plan, evaluate, read_stack_file
from infra import stack as stack_module
from trainer.common.cli import OneLineParser


@contextmanager
def pools(count: int):
    """Declare the cluster component ``count`` times (bench-only; the program has one)."""
    real = stack_module.GpuCluster

    def many(name, cluster, args, opts=None):
        first = real(name, cluster, args, opts)
        for extra in range(1, count):
            more = dataclasses.replace(args, account_name=f"{args.account_name[:22]}{extra}")
            real(f"{name}-pool{extra}", cluster, more, opts)
        return first

    stack_module.GpuCluster = many  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        stack_module.GpuCluster = real  # type: ignore[misc]


def timed(run: Callable[[], Plan], repeat: int) -> tuple[list[float], int]:
    times, count = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        plan = run()
        times.append(time.perf_counter() - started)
        count = len(plan.resources)
    return times, count


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pools", default="1,2,5,10")
    args = parser.parse_args()
    stacks = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in REPO.glob("Pulumi.*.yaml"))
    values = {name: read_stack_file(REPO / f"Pulumi.{name}.yaml") for name in stacks}
    started = time.perf_counter()
    evaluate(stacks[0], values[stacks[0]])
    cold = time.perf_counter() - started
    print(f"cold first evaluation (imports included): {cold:.2f} s")
    print(f"{'case':<16}{'resources':>10}{'median s':>10}{'min s':>8}{'max s':>8}")
    rows = {}
    cases: list[tuple[str, Callable[[], Plan], int]] = [
        (name, lambda name=name: evaluate(name, values[name]), 1) for name in stacks
    ]
    cases += [
        (f"dev, {n} pools", lambda: evaluate("dev", values["dev"]), n)
        for n in (int(p) for p in args.pools.split(","))
    ]
    for label, run, count in cases:
        with pools(count):
            times, resources = timed(run, args.repeat)
        rows[label] = {
            "resources": resources,
            "median_s": statistics.median(times),
            "min_s": min(times),
            "max_s": max(times),
            "pools": count,
        }
        print(
            f"{label:<16}{resources:>10}{statistics.median(times):>10.3f}"
            f"{min(times):>8.3f}{max(times):>8.3f}",
            flush=True,
        )
    save("program_eval", {"cold_s": cold, "cases": rows})


if __name__ == "__main__":
    main()
