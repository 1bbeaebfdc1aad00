"""Where a run is (``RunPosition``: the step, the epoch and the place in it that every
checkpoint saves and a resume on any number of workers continues from) and each rank's random
streams, saved and restored with it."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from trainer.checkpoints import single_file


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class RunPosition:
    """Where the run is: the resume keys every checkpoint saves, written and read only by
    ``state_dict()`` / ``load_state_dict()``.

    - ``step``: optimizer steps taken, over every invocation and whatever world size took
      them. It names checkpoints, and ``--max-steps`` / ``--run-steps`` count it: after a
      resume on another number of workers the remaining steps are steps of the new size.
    - ``epoch``: epochs finished. ``epoch_offset``: samples of this epoch's global order
      trained, by all ranks and any number of them (see ``trainer.data.sampler``), so a resume
      on another size continues the epoch exactly and ``--epochs`` stays exact.
      ``epoch_world``: the workers the epoch began on (the shard stream's order depends on it).
    - ``step_in_epoch``: the LR schedule's position in the epoch, in steps of this size:
      ``steps_per_epoch`` minus the steps left. Without a resize, the steps taken in the epoch.
      The schedule runs on ``epoch * steps_per_epoch + step_in_epoch``, so warmup, decay epochs
      and the end fall on the same epochs whatever size the earlier steps had.
    """

    epoch_world: int
    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    epoch_offset: int = 0

    def schedule_step(self, steps_per_epoch: int) -> int:
        """The LR schedule's step at this position (``steps_per_epoch`` of this world size)."""
        return self.epoch * steps_per_epoch + self.step_in_epoch

    def state_dict(self) -> dict[str, int]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "epoch_offset": self.epoch_offset,
            "epoch_world_size": self.epoch_world,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Read a checkpoint's position (older checkpoints lack the offsets; see
        ``single_file.epoch_position``)."""
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.step_in_epoch = int(state["step_in_epoch"])
        self.epoch_offset, self.epoch_world = single_file.epoch_position(state)
