"""The device a rank trains on and the precision and memory layout it trains with."""

from __future__ import annotations

import os

import torch

from trainer.common.errors import ConfigError
from trainer.engines import cpu_affinity as affinity
from trainer.engines.base import Dist
from trainer.settings.train_config import TrainConfig


def select_device(cfg: TrainConfig, dist: Dist) -> torch.device:
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        share = None
        if cfg.cpu_affinity != "off":
            share = affinity.bind_local_rank(dist.local_rank, dist.local_size)
        # One worker per core share: oversubscribed threads make CPU allreduce crawl. An
        # explicit OMP_NUM_THREADS wins (benchmarks pin one thread per worker).
        if "OMP_NUM_THREADS" not in os.environ:
            threads = len(share) if share else (os.cpu_count() or 1) // dist.local_size
            torch.set_num_threads(max(1, threads))
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device='cuda': no CUDA device is visible; use --device auto or cpu")
    torch.cuda.set_device(dist.local_rank)
    if cfg.cpu_affinity == "on":
        affinity.bind_local_rank(dist.local_rank, dist.local_size)
    return torch.device("cuda", dist.local_rank)


def resolve_precision(cfg: TrainConfig, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None, channels_last): bf16 and NHWC by default on GPUs only."""
    amp = cfg.amp
    if amp == "auto":
        amp = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "off"
    dtype = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    channels_last = cfg.channels_last == "on" or (
        cfg.channels_last == "auto" and device.type == "cuda"
    )
    return dtype, channels_last
