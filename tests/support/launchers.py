"""Launchers for real two-process runs on 127.0.0.1 (Horovod over Gloo, torch.distributed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import tiny_config

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def horovodrun(*python_args: str, workers: int = 2) -> list[str]:
    """``workers`` (two) Horovod workers each running ``python *python_args``."""
    return [
        str(BIN / "horovodrun"),
        "--gloo",
        "-np",
        str(workers),
        "-H",
        f"localhost:{workers}",
        sys.executable,
        *python_args,
    ]


def torchrun(*python_args: str, workers: int = 2) -> list[str]:
    """``workers`` (two) torch.distributed workers each running ``python *python_args``."""
    # --standalone: a local c10d rendezvous on a free port, so parallel CI jobs never collide.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(workers),
        *python_args,
    ]


# ResNet-18 at 32 px on two Horovod workers: steps slow enough (~0.1 s) to land a signal
# mid-epoch. 2 epochs of 12 steps.
SIGNAL_RUN = dict(
    model="resnet18",
    image_size=32,
    batch_size=8,
    synthetic_size=192,
    epochs=2,
    log_every=1,
    backend="horovod",
)
SIGNAL_RUN_STEPS = 2 * (192 // 2 // 8)  # 24


def small_config(output_dir: Path, **extra) -> dict:
    """The shared tiny run with 8 steps per epoch for each of two workers."""
    return tiny_config(
        output_dir,
        **{"synthetic_size": 128, "synthetic_pool": 64, "epochs": 2, "log_every": 2, **extra},
    )


def read_metrics(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
