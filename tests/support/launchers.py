"""Launchers for real two-process runs on 127.0.0.1 (Horovod over Gloo, torch.distributed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import tiny_config
from trainer.settings.flags import to_flags

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


PACED_TRAINER = REPO / "tests" / "support" / "paced_trainer.py"


def paced_trainer(config: dict, seconds: float, ranks: str = "every") -> list[str]:
    """Python's arguments for ``dt-train`` with ``config``, the batches of ``ranks`` (a rank's
    number, ``every`` or ``none``) arriving ``seconds`` late (``paced_trainer.py``)."""
    return [str(PACED_TRAINER), ranks, str(seconds), *to_flags(config)]


# The tiny CNN on two Horovod workers, every batch 0.2 s late: steps slow enough to land a
# signal mid-epoch, at almost no CPU (ResNet-18 at 32 px made them slow by computing, at twice
# the CPU of the whole run). 2 epochs of 12 steps.
SIGNAL_RUN = dict(batch_size=8, synthetic_size=192, epochs=2, log_every=1, backend="horovod")
SIGNAL_RUN_STEPS = 2 * (192 // 2 // 8)  # 24
SIGNAL_STEP_SECONDS = 0.2


def signal_run(config: dict) -> list[str]:
    """Python's arguments for a run of ``SIGNAL_RUN``'s pace."""
    return paced_trainer(config, SIGNAL_STEP_SECONDS)


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


def mirrored_checkpoints(container, prefix: str = "checkpoints/") -> list[str]:
    """The manifests of the checkpoints mirrored whole under ``prefix`` in a Blob container (a
    checkpoint's manifest is written last: trainer.checkpoints.mirror)."""
    from trainer.checkpoints.mirror import MANIFEST_SUFFIX

    names = [blob.name for blob in container.list_blobs(name_starts_with=prefix)]
    return [name for name in names if name.endswith(MANIFEST_SUFFIX)]
