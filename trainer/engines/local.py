"""One process, no collectives: the engine of a laptop run and of most tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.engines.base import Dist


class LocalDist(Dist):
    """One process, no communication: every collective is the identity."""

    name = "local"

    def __init__(self) -> None:
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.local_size = 1

    @property
    def gpu_collectives(self) -> bool:
        return False

    def broadcast_parameters(self, model: nn.Module) -> None:
        return None

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def any_rank(self, flag: bool) -> bool:
        return flag

    def barrier(self) -> None:
        return None

    def shutdown(self) -> None:
        return None
