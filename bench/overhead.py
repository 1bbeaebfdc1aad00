"""Overhead: the trainer's step throughput against a bare PyTorch loop with the same model,
synthetic data, optimizer and loss in one process (ratio = trainer / bare, the median of
per-round ratios). The two run back to back in each round, and which goes first alternates, so
a machine that speeds up or slows down favours neither. A benchmark: prints and saves, asserts
nothing.

    .venv/bin/python -m bench.overhead [--rounds 4] [--steps 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

from bench.common import REPO, run_trainer, save
from trainer.common.cli import OneLineParser
from trainer.models.build import build_model

MODEL, CLASSES, SIZE, BATCH, POOL = "resnet18", 100, 64, 32, 64
WINDOW = 4  # steps per measured window, as the trainer's --log-every
THREADS = {"OMP_NUM_THREADS": str(torch.get_num_threads())}


def bare_loop(steps: int) -> float:
    """The same work as one trainer step, written the shortest way: median window images/sec."""
    torch.manual_seed(0)
    model = build_model(MODEL, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.0)
    images = torch.randn(POOL, 3, SIZE, SIZE)
    labels = torch.randint(0, CLASSES, (POOL,))
    model.train()
    rates, started = [], time.perf_counter()
    for step in range(1, steps + 1):
        index = torch.randint(0, POOL, (BATCH,))
        loss = criterion(model(images[index]), labels[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % WINDOW == 0:
            loss.item()  # the trainer also syncs when it logs
            now = time.perf_counter()
            rates.append(WINDOW * BATCH / (now - started))
            started = now
    return statistics.median(rates[1:])


def bare_run(steps: int) -> float:
    """The bare loop in its own process with the trainer's environment (threads included)."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.overhead", "--bare-loop", str(steps)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, **THREADS},
    )
    return float(result.stdout.strip())


def trainer_run(steps: int) -> float:
    flags = [
        "--backend",
        "local",
        "--model",
        MODEL,
        "--num-classes",
        str(CLASSES),
        "--image-size",
        str(SIZE),
        "--batch-size",
        str(BATCH),
        "--synthetic-pool",
        str(POOL),
        "--synthetic-size",
        str(BATCH * steps),
        "--max-steps",
        str(steps),
        "--warmup-epochs",
        "0",
        "--log-every",
        str(WINDOW),
        "--checkpoint-every",
        "0",
        "--amp",
        "off",
        "--channels-last",
        "off",
    ]
    return run_trainer([sys.executable], flags, THREADS)


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--bare-loop", type=int, metavar="STEPS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_loop:  # the child process of bare_run
        print(bare_loop(args.bare_loop))
        return
    bare, trainer = [], []
    for round_ in range(args.rounds):
        # Alternate which goes first, so a machine that slows down over time favours neither.
        if round_ % 2:
            trainer.append(trainer_run(args.steps))
            bare.append(bare_run(args.steps))
        else:
            bare.append(bare_run(args.steps))
            trainer.append(trainer_run(args.steps))
        print(f"bare {bare[-1]:.1f} img/s, trainer {trainer[-1]:.1f} img/s", flush=True)
    # Per-round ratios: each pair ran back to back, so drifts in machine speed cancel.
    ratio = statistics.median(t / b for t, b in zip(trainer, bare, strict=True))
    print(
        f"trainer / bare loop: {ratio:.3f} ({MODEL}, {SIZE} px, batch {BATCH}, "
        f"{torch.get_num_threads()} threads)"
    )
    save(
        "overhead",
        {
            "bare_images_per_sec": bare,
            "trainer_images_per_sec": trainer,
            "ratio": ratio,
            "steps": args.steps,
        },
    )


if __name__ == "__main__":
    main()
