"""A plug-in model (``--model tests.trainer.watch.stuck_rank:build``) whose forward, on rank
``STUCK_RANK`` at its ``STUCK_STEP``-th training step, blocks inside the engine: it waits in
``torch.distributed.recv`` for a message no rank sends, while the other ranks wait for its
gradients in their allreduce. Only the first run blocks: it leaves the file ``STUCK_MARKER``
names (by default ``stuck.marker`` in the run's output folder, which every try of a job on
the shared file system sees), so the retry (the same command) trains through."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as td
from torch import nn


class StuckRank(nn.Module):
    def __init__(self, inputs: int, classes: int, marker: Path) -> None:
        super().__init__()
        self.head = nn.Linear(inputs, classes)
        self.training_calls = 0
        self.marker = marker

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.training_calls += 1
            if self.training_calls == int(os.environ["STUCK_STEP"]):
                maybe_block_in_a_collective(self.marker)
        return self.head(x.flatten(1))


def maybe_block_in_a_collective(marker: Path) -> None:
    rank = td.get_rank()
    if rank == int(os.environ["STUCK_RANK"]) and not marker.exists():
        marker.write_text(f"rank {rank} blocked\n")
        td.recv(torch.zeros(1), src=(rank + 1) % td.get_world_size())  # never sent


def build(cfg, **_args) -> nn.Module:
    marker = os.environ.get("STUCK_MARKER") or Path(cfg.output_dir) / "stuck.marker"
    return StuckRank(3 * cfg.image_size * cfg.image_size, cfg.num_classes, Path(marker))
