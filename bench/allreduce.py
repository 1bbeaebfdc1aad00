"""The allreduce alone: milliseconds per allreduce of ResNet-18's 47 MB of gradients, Horovod
against torch.distributed, each set up as the trainer sets it up (Horovod in place, under one
name, the caller waiting, with the trainer's cycle time and fusion buffer for Gloo on CPUs), on
2 ranks, Gloo on 127.0.0.1, and the same Horovod with only the first of our patches
(bench/baseline_horovod.py). It tells how much of bench.scaling's gap is the collective itself.
The engines take turns over 3 rounds, each round the median of 20 allreduces (one launch reads
50-130 ms here, so a single launch says little); printed per round, then the medians. A
benchmark: prints and saves, asserts nothing.

    .venv/bin/python -m bench.allreduce [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess

from bench import baseline_horovod
from bench.common import REPO, horovodrun, save, torchrun
from bench.scaling import BASELINE
from trainer.common.cli import OneLineParser


def engines(baseline_env: dict[str, str]) -> dict:
    """Each row: its launcher, the probe's engine, and its environment (the baseline's puts its
    engine first on PYTHONPATH: ``bench.baseline_horovod.row_env``)."""
    return {
        "horovod": (horovodrun, "horovod", {}),
        BASELINE: (horovodrun, "horovod", baseline_env),
        "ddp": (torchrun, "ddp", {}),
    }


def allreduce_ms(row: tuple, workers: int) -> float:
    """One launch of bench.allreduce_probe for ``row`` (of ``engines()``): its median
    milliseconds per allreduce."""
    launcher, engine, env = row
    command = [*launcher(workers), "-m", "bench.allreduce_probe", engine]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return last_number(result.stdout)


def last_number(stdout: str) -> float:
    """The probe's figure: the last line's trailing number (horovodrun prefixes worker lines, as
    in "[0]<stdout>:147.3")."""
    numbers = re.findall(r"([0-9.]+)\s*$", stdout, re.M)
    if not numbers:
        raise RuntimeError(f"bench.allreduce_probe printed no figure:\n{stdout[-3000:]}")
    return float(numbers[-1])


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"allreduce of 47 MB (ResNet-18's gradients), {args.workers} ranks, Gloo on 127.0.0.1")
    rows = engines(baseline_horovod.row_env())
    rounds: dict[str, list[float]] = {name: [] for name in rows}
    for number in range(1, args.rounds + 1):
        for name, row in rows.items():
            rounds[name].append(allreduce_ms(row, args.workers))
        print(f"round {number}: " + ", ".join(f"{e} {ms[-1]:.1f} ms" for e, ms in rounds.items()))
    medians = {engine: statistics.median(ms) for engine, ms in rounds.items()}
    print(
        "median: "
        + ", ".join(f"{engine} {ms:.1f} ms" for engine, ms in medians.items())
        + f"; Horovod / torch.distributed {medians['horovod'] / medians['ddp']:.2f}, / the "
        f"engine with the first patch only {medians['horovod'] / medians[BASELINE]:.2f}"
    )
    path = save(
        "allreduce", {"workers": args.workers, "ms_per_round": rounds, "median_ms": medians}
    )
    print(f"saved {path.relative_to(path.parents[2])}")


if __name__ == "__main__":
    main()
