"""A run's checkpoints behind one interface, ``Checkpointer``, whose format is chosen once
(``trainer.checkpoints.choose``): one file written by rank 0 (``single_file``) when every rank
holds the whole model, or every rank's shards (``sharded``) when the engine shards it. It decides
when as well as how: the run says where it is, ``cadence`` says whether a checkpoint is due.
Writes go on in the background (``background``); see docs/trainer.md.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.checkpoints import mirror as checkpoint_mirror
from trainer.checkpoints.background import BackgroundWriter, StepFence
from trainer.checkpoints.cadence import Moment, checkpoint_due
from trainer.common.errors import ConfigError
from trainer.engines.base import Dist
from trainer.settings.train_config import DEFAULTS, TrainConfig

log = logging.getLogger(__name__)
# Where each checkpoint went and who wrote it (on Batch the task's non-admin user, on the shared
# runs folder): python -m dt_commands.acceptance reads this line from the job's log.
CHECKPOINT_WRITTEN = "checkpoint written: %s (uid %d)"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written; the message names the path."""


# Settings that change what a checkpoint's tensors mean: resuming across them is refused.
_CHECKPOINT_IDENTITY = ("model", "model_args", "num_classes", "optimizer")
# Checkpoint entries that are the model's and optimizer's tensors; the rest is the trainer's.
_TENSOR_ENTRIES = ("model", "optimizer")

TrainerState = Callable[[], dict[str, Any]]


def incompatibility(cfg: TrainConfig, path: Path, saved: dict[str, Any]) -> str | None:
    """Why ``cfg`` cannot resume from the checkpoint at ``path`` (saved with ``saved``), or None."""
    for key in _CHECKPOINT_IDENTITY:
        # A setting older checkpoints lack had its default then.
        was = saved.get(key, getattr(DEFAULTS, key))
        if was != getattr(cfg, key):
            return (
                f"{key}={getattr(cfg, key)!r}: checkpoint {path} was trained with "
                f"{key}={was!r}; use the same setting or another --output-dir"
            )
    return None


class Checkpointer(ABC):
    """Saves and restores the states it is built with: the model, its optimizer, and the
    trainer's own entries (``trainer_state``, called on every rank at each save: a collective).

    Every public method is a collective: every rank calls it at the same point of the run.
    ``last_step`` is the step of the newest checkpoint this run wrote or resumed from.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        dist: Dist,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        trainer_state: TrainerState,
    ) -> None:
        self.cfg, self.dist, self.model, self.optimizer = cfg, dist, model, optimizer
        self._trainer_state = trainer_state
        self.folder = Path(cfg.output_dir) / "checkpoints"
        self.last_step = -1
        self._writes = BackgroundWriter()
        # A background save's copy overlaps the next step; that step's optimizer.step() waits
        # for it (the fence is the optimizer's step pre-hook).
        self._fence = StepFence(optimizer)
        # Rank 0 copies each finished checkpoint to Blob storage (trainer.checkpoints.mirror).
        self._mirror = checkpoint_mirror.build(cfg, dist.is_root)

    # ------------------------------------------------------------------ the interface
    @abstractmethod
    def load(self) -> tuple[Path, dict[str, Any]] | None:
        """Restore the model and optimizer from the newest valid checkpoint on every rank;
        return its path and the trainer's entries, or None when there is none."""

    def save(
        self,
        step: int,
        moment: Moment = Moment.STEP,
        *,
        ends_epoch: bool = False,
        stops: bool = False,
    ) -> float | None:
        """At ``moment`` of ``step`` (``ends_epoch``, ``stops``: the step ends the epoch, the
        run stops after it): its checkpoint when one is due (``cadence.checkpoint_due``); the
        stall it cost in seconds, or None when none was due. At the stop a write in flight is
        waited for either way."""
        every = self.cfg.checkpoint_every
        if checkpoint_due(
            moment, step, every=every, written=self.last_step, ends_epoch=ends_epoch, stops=stops
        ):
            return self._write(step, final=moment is Moment.STOP)
        if moment is Moment.STOP:
            self.wait()
        return None

    def wait(self) -> None:
        """Wait for the write in flight, if any; its failure stops every rank."""
        self._agree(self._writes.wait())

    def close(self) -> None:
        """After the run or an error: a write in flight still finishes (it is atomic and
        complete, or it is never loaded), then its mirror's upload; nothing waits for the other
        ranks any more."""
        self._writes.close()
        if self._mirror is not None:
            self._mirror.close()

    # ------------------------------------------------------------------ shared steps
    def _write(self, step: int, *, final: bool) -> float:
        """Write the checkpoint of ``step``. Waits for the write in flight, takes a copy of the
        state (the stall training sees, returned in seconds; in the background the optimizer's
        state and parameters are copied while the next step runs, see ``StepFence``) and writes
        it, in the background unless ``--no-checkpoint-async`` or ``final`` (returns once its
        bytes are on disk). A failure on any rank stops all."""
        started = time.monotonic()
        self.wait()
        trainer_state = self._trainer_state()
        background = self.cfg.checkpoint_async and not final
        self._start(step, trainer_state, background)
        if not background:
            self.wait()
        self.last_step = step
        return time.monotonic() - started

    @abstractmethod
    def _start(self, step: int, trainer_state: dict[str, Any], background: bool) -> None:
        """Copy the state of ``step`` and submit its write to ``self._writes``."""

    @abstractmethod
    def _find_latest(self) -> tuple[Path, dict[str, Any]] | None:
        """Rank 0: the newest checkpoint that loads, with what was read of it."""

    def _fetch_mirrored(self, listed: list[tuple[int, Path]], kind: str) -> None:
        """Rank 0, before ``_find_latest``: the mirror's newest verified checkpoint, when newer
        than the local folder's newest (``listed``), downloaded into the local folder."""
        if self._mirror is not None:
            self._mirror.fetch_newer(self.folder, listed[0][0] if listed else -1, kind)

    def _latest(self) -> tuple[Path | None, dict[str, Any] | None, dict[str, Any] | None]:
        """Every rank: the newest valid checkpoint's path and trainer entries as rank 0 found
        them (None, None without one), and rank 0's whole read (None elsewhere). A checkpoint
        of other settings (``_CHECKPOINT_IDENTITY``) stops every rank with one line."""
        shared = path = error = state = None
        if self.dist.is_root:
            latest = self._find_latest()
            if latest is not None:
                path, state = latest
                error = incompatibility(self.cfg, path, state["config"])
                if error is None:
                    shared = {k: v for k, v in state.items() if k not in _TENSOR_ENTRIES}
        shared, path, error = self.dist.broadcast_object((shared, path, error))
        if error:
            raise ConfigError(error)
        if shared is not None:
            self.last_step = int(shared["step"])
        return path, shared, state

    def _agree(self, error: str | None) -> None:
        """Every rank learns whether any rank's save failed, and the failure rank 0 saw (a
        collective); then every rank raises it."""
        if self.dist.any_rank(error is not None):
            first = self.dist.broadcast_object(error)
            raise CheckpointError(
                first or "cannot write a checkpoint: another rank failed (its log says why)"
            )
