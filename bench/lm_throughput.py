"""Language-model training throughput on CPU: tokens/sec for gpt-tiny and gpt-small on 1 local
process, 2 DDP ranks and 2 FSDP ranks (``--shard-within world``), with the scaling efficiency
(total tokens/sec on 2 ranks / (2 x one process's)) and the model TFLOPS per worker (6N FLOPs
per token, ``trainer.models.gpt_sizes``). A benchmark: prints and saves, asserts nothing.

    .venv/bin/python -m bench.lm_throughput [--rounds 2]

Each worker gets one thread (OMP_NUM_THREADS=1) so 2 workers use the 2 cores, as in
``bench.scaling``; the engines take turns over the rounds and keep medians. Random tokens,
AdamW; the first logging window (warm-up) is left out.
"""

from __future__ import annotations

import statistics
import sys

from bench.common import run_records, save, steady_value, torchrun
from trainer.common.cli import OneLineParser

ROUNDS = 2
WORKERS = 2
MODELS = {
    # name -> flags: the byte vocabulary and full context for the tiny model; GPT-2's vocabulary
    # (124M parameters) and a short context for gpt-small, so that a step takes seconds here.
    "gpt-tiny": ["--context", "128", "--batch-size", "8", "--max-steps", "24", "--log-every", "8"],
    "gpt-small": [
        "--vocab-size", "50257", "--context", "64", "--batch-size", "1",
        "--max-steps", "4", "--log-every", "1",
    ],
}  # fmt: skip
ENGINES = {
    "local": (lambda: [sys.executable], ["--backend", "local"], 1),
    "ddp": (lambda: torchrun(WORKERS), ["--backend", "ddp"], WORKERS),
    "fsdp": (lambda: torchrun(WORKERS), ["--backend", "fsdp", "--shard-within", "world"], WORKERS),
}
COMMON = [
    "--data", "synthetic", "--synthetic-size", "4096", "--optimizer", "adamw", "--lr", "3e-4",
    "--warmup-epochs", "0", "--checkpoint-every", "0", "--keep-checkpoints", "1",
]  # fmt: skip


def efficiency(total_n: float, single: float, workers: int) -> float:
    """Scaling efficiency: total throughput on ``workers`` / (``workers`` x one worker's)."""
    return total_n / (workers * single)


def measure(rounds: int) -> dict:
    samples: dict[tuple[str, str], dict[str, list[float]]] = {}
    for _ in range(rounds):
        for model, model_flags in MODELS.items():
            for engine, (launcher, engine_flags, _) in ENGINES.items():
                records = run_records(
                    launcher(),
                    ["--model", model, *model_flags, *COMMON, *engine_flags],
                    {"OMP_NUM_THREADS": "1"},
                )
                row = samples.setdefault((model, engine), {"total": [], "tflops": []})
                row["total"].append(steady_value(records, "tokens_per_sec_total"))
                row["tflops"].append(steady_value(records, "model_tflops"))
                print(f"  {model:<10}{engine:<6}{row['total'][-1]:>10.1f} tokens/s", flush=True)
    rows: dict[str, dict] = {}
    for (model, engine), row in samples.items():
        workers = ENGINES[engine][2]
        total = statistics.median(row["total"])
        rows.setdefault(model, {})[engine] = {
            "workers": workers,
            "tokens_per_sec_total": total,
            "tokens_per_sec_per_worker": total / workers,
            "model_tflops_per_worker": statistics.median(row["tflops"]),
            "runs": len(row["total"]),
        }
    for engines in rows.values():
        single = engines["local"]["tokens_per_sec_total"]
        for row in engines.values():
            row["efficiency"] = efficiency(row["tokens_per_sec_total"], single, row["workers"])
    return rows


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    print(f"random tokens, AdamW, one thread per worker, {args.rounds} rounds (medians)")
    rows = measure(args.rounds)
    header = f"{'model':<11}{'engine':<7}{'tokens/s':>10}{'per worker':>12}"
    print(f"{header}{'efficiency':>12}{'TFLOPS':>9}")
    for model, engines in rows.items():
        for engine, row in engines.items():
            print(
                f"{model:<11}{engine:<7}{row['tokens_per_sec_total']:>10.1f}"
                f"{row['tokens_per_sec_per_worker']:>12.1f}{row['efficiency']:>12.3f}"
                f"{row['model_tflops_per_worker']:>9.4f}"
            )
    path = save("lm_throughput", {"rounds": args.rounds, "workers": WORKERS, "results": rows})
    print(f"saved {path.relative_to(path.parents[2])}")


if __name__ == "__main__":
    main()
