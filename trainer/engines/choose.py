"""The engine a run's settings choose (``--backend``), started."""

from __future__ import annotations

from trainer.engines.base import Dist
from trainer.engines.ddp import TorchDist
from trainer.engines.fsdp import FSDPDist
from trainer.engines.horovod import HorovodDist
from trainer.engines.local import LocalDist
from trainer.settings.train_config import TrainConfig


def init_dist(cfg: TrainConfig) -> Dist:
    """Start the configured backend (``trainer.settings.choices.BACKENDS``)."""
    backend = cfg.backend
    if backend == "horovod":
        return HorovodDist(cfg.horovod_cycle_time_ms, cfg.horovod_fusion_mb)
    if backend == "ddp":
        return TorchDist()
    if backend == "fsdp":
        return FSDPDist(cfg.shard_within)
    return LocalDist()
