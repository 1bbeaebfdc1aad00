"""The run's one ``Checkpointer``, its format chosen once from the engine: sharded when the
engine shards the model (FSDP), else one file written by rank 0."""

from __future__ import annotations

import torch
from torch import nn

from trainer.checkpoints.checkpointer import Checkpointer, TrainerState
from trainer.checkpoints.sharded import ShardedCheckpointer
from trainer.checkpoints.single_file import SingleFileCheckpointer
from trainer.engines.base import Dist
from trainer.settings.train_config import TrainConfig


def build_checkpointer(
    cfg: TrainConfig,
    dist: Dist,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: TrainerState,
    device: torch.device,
) -> Checkpointer:
    """The run's checkpointer, chosen once: sharded when the engine shards the model's state."""
    kind = ShardedCheckpointer if dist.sharded_state else SingleFileCheckpointer
    return kind(cfg, dist, model, optimizer, trainer_state, device=device)
