"""Points on interleaved spiral arms, one class per arm: the team's dataset.

``build(cfg, **data_args)`` is the factory ``--data examples.custom_model.data:build`` names; it
returns a (train, val) pair of map-style datasets of ``(features, label)``. A sample depends
only on its index (and the seed), never on a global random state, so the trainer's sampler can
resume mid-epoch and every worker reads the same sample for the same index.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.data import Dataset

FEATURES = 2


class Spirals(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int, arms: int, seed: int, noise: float = 0.1) -> None:
        self.size, self.arms, self.seed, self.noise = size, arms, seed, noise

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        arm = index % self.arms
        radius = float(torch.rand((), generator=generator))
        angle = 3 * math.pi * radius + 2 * math.pi * arm / self.arms
        point = torch.tensor([radius * math.cos(angle), radius * math.sin(angle)])
        point += self.noise * torch.randn(FEATURES, generator=generator)
        return point, torch.tensor(arm)


def build(cfg: Any, size: int = 2048, val_size: int = 256) -> tuple[Spirals, Spirals]:
    """Training and validation points for ``cfg.num_classes`` arms, drawn from ``cfg.seed``."""
    return (
        Spirals(size, cfg.num_classes, cfg.seed),
        Spirals(val_size, cfg.num_classes, cfg.seed + 1),
    )
