"""Scaling: the same model and per-worker batch on 1 and N workers, Horovod and DDP side by side
(images/sec and scaling efficiency = throughput_N / (N x throughput_1)), plus what Horovod's fp16
gradient compression and tensor fusion change. A benchmark: prints and saves, asserts nothing.

    .venv/bin/python -m bench.scaling [--workers 2] [--steps 48]

Each worker gets one thread (OMP_NUM_THREADS=1) so N workers use N cores, as N GPUs would.
"""

from __future__ import annotations

import os
import re
import subprocess

from bench.common import REPO, horovodrun, run_trainer, save, torchrun
from trainer.cli import OneLineParser

MODEL = [
    "--model",
    "resnet18",
    "--num-classes",
    "100",
    "--image-size",
    "64",
    "--batch-size",
    "32",
    "--synthetic-pool",
    "64",
    "--warmup-epochs",
    "0",
    "--log-every",
    "4",
    "--checkpoint-every",
    "0",
    "--keep-checkpoints",
    "1",
]


CYCLE_1MS = ["--horovod-cycle-time-ms", "1"]
# Issue goals, printed beside what this run measured (ratios within one run: absolute figures
# drift on a shared machine).
PARITY_GOAL = 0.95  # Horovod's efficiency / DDP's
EFFICIENCY_GOAL = 0.85  # Horovod's efficiency with 2 workers on 2 cores


def measure(workers: int, steps: int) -> dict:
    flags = [*MODEL, "--max-steps", str(steps), "--synthetic-size", str(32 * steps * workers)]
    one_thread = {"OMP_NUM_THREADS": "1"}
    rows = {}
    for engine, launcher, extra, env in (
        ("horovod", horovodrun, ["--backend", "horovod"], {}),
        ("ddp", torchrun, ["--backend", "ddp"], {}),
        # Horovod's own default cycle (1 ms) against the trainer's choice for Gloo on CPUs.
        ("horovod 1 ms cycle", horovodrun, ["--backend", "horovod", *CYCLE_1MS], {}),
        ("horovod fp16", horovodrun, ["--backend", "horovod", "--fp16-allreduce"], {}),
        (
            "horovod no fusion",
            horovodrun,
            ["--backend", "horovod"],
            {"HOROVOD_FUSION_THRESHOLD": "0"},
        ),
    ):
        base = {**one_thread, **env}
        single = run_trainer(launcher(1), [*flags[:-1], str(32 * steps), *extra], base)
        multi = run_trainer(launcher(workers), [*flags, *extra], base)
        rows[engine] = {
            "images_per_sec_1": single,
            f"images_per_sec_{workers}": multi,
            "efficiency": multi / (workers * single),
        }
        print(
            f"{engine:<20}{single:>10.1f}{multi:>12.1f}{rows[engine]['efficiency']:>12.3f}",
            flush=True,
        )
    return rows


def allreduce_ms(workers: int) -> dict[str, float]:
    """Milliseconds per allreduce of ResNet-18's gradients, per engine (explains the gap)."""
    out = {}
    for engine, launcher in (("horovod", horovodrun), ("ddp", torchrun)):
        result = subprocess.run(
            [*launcher(workers), "-m", "bench.allreduce_probe", engine],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        # horovodrun prefixes worker lines ("[0]<stdout>:147.3"): take the trailing number.
        numbers = re.findall(r"([0-9.]+)\s*$", result.stdout, re.M)
        out[engine] = float(numbers[-1])
    return out


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    print(f"ResNet-18, 64 px, 32 images per worker, {args.steps} steps, Gloo on 127.0.0.1")
    print(f"{'engine':<20}{'1 worker':>10}{f'{args.workers} workers':>12}{'efficiency':>12}")
    rows = measure(args.workers, args.steps)
    horovod, ddp = rows["horovod"]["efficiency"], rows["ddp"]["efficiency"]
    print(
        f"Horovod at parity: efficiency {horovod:.3f} = {horovod / ddp:.3f} x DDP's {ddp:.3f} "
        f"(goals: >= {PARITY_GOAL} x DDP, >= {EFFICIENCY_GOAL} absolute)"
    )
    probe = allreduce_ms(args.workers)
    print(
        "allreduce of 47 MB of gradients: "
        + ", ".join(f"{engine} {ms:.0f} ms" for engine, ms in probe.items())
    )
    path = save(
        "scaling",
        {"workers": args.workers, "steps": args.steps, "results": rows, "allreduce_47mb_ms": probe},
    )
    print(f"saved {path.relative_to(path.parents[2])}")


if __name__ == "__main__":
    main()
