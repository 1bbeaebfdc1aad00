"""A small residual MLP classifier: the team's ``nn.Module``.

``build(cfg, **model_args)`` is the factory ``--model examples.custom_model.model:build`` names;
``cfg`` is the trainer's validated config (here only ``num_classes`` is read), the keyword
arguments come from ``--model-args '{width: 64, depth: 3}'``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Block(nn.Module):
    """One residual block: what FSDP shards (and activation checkpointing recomputes) as a
    unit."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, width * 2), nn.GELU(), nn.Linear(width * 2, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class SpiralNet(nn.Module):
    def __init__(self, features: int, width: int, depth: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def sharding_units(self) -> list[nn.Module]:
        """The blocks FSDP shards one by one (optional: the trainer's default takes the
        entries of the model's outermost ModuleLists, the same here)."""
        return list(self.blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(cfg: Any, width: int = 64, depth: int = 2) -> nn.Module:
    """The model for ``cfg.num_classes`` spiral arms (the data's ``arms``)."""
    from .data import FEATURES  # relative: the same as a code: folder (custom_model)

    return SpiralNet(FEATURES, width, depth, cfg.num_classes)
