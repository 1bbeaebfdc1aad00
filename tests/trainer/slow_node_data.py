"""A plug-in dataset (``--data tests.trainer.slow_node_data:build``): the custom-model example's
spirals, every sample ``seconds`` late on the node Batch did not make the master
(``AZ_BATCH_IS_CURRENT_NODE_MASTER``), as a node with a slow disk or a starved loader would
serve them; the other nodes' ranks read at full speed."""

from __future__ import annotations

import os
import time
from typing import Any

from torch.utils.data import Dataset

from examples.custom_model.data import build as spirals


class Slowed(Dataset):
    def __init__(self, inner: Dataset, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.seconds)
        return self.inner[index]


def build(cfg: Any, seconds: float = 0.0) -> tuple[Dataset, Dataset]:
    train, val = spirals(cfg)
    if os.environ.get("AZ_BATCH_IS_CURRENT_NODE_MASTER") == "false":
        train = Slowed(train, seconds)
    return train, val
