"""What a run comes to: its figures (``RunResult``), and at its end the results folder rank 0
writes from them (``trainer.outputs.results``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from torch import nn

from trainer.engines.base import Dist
from trainer.outputs import results
from trainer.settings.train_config import TrainConfig

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    step: int
    epoch: int
    start_step: int
    stopped_by: str
    last_metrics: dict[str, float]
    # Samples per second: images, or a language model's tokens (``unit``).
    samples_per_sec: float
    samples_per_sec_total: float
    global_batch: int
    # The smoothed gradient noise scale at the end (--noise-scale-every), or None.
    noise_scale: float | None
    unit: str
    model: nn.Module
    # Rank 0's complete results folder (trainer.outputs.results) when the run reached its end.
    results: Path | None = None
    # Images replaced because they did not decode (--on-bad-image skip), over every rank.
    skipped_images: int = 0
    # Ranks that held the others up (--straggler-every): rank, host, which time, how often.
    stragglers: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The run's figures as JSON values (results/metrics.json)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("model", "results")
        }


def write_results(
    result: RunResult,
    *,
    cfg: TrainConfig,
    dist: Dist,
    folder: Path,
    final_evaluation: Callable[[], dict[str, float] | None],
) -> Path | None:
    """Every rank (collectives: the final evaluation, FSDP's gather). At the run's end rank 0
    writes ``folder`` (``trainer.outputs.results``) and returns it; a paused run (a signal,
    --run-steps) writes none. A run found finished already keeps complete results."""
    if result.stopped_by not in (*results.FINISHED, "already_complete"):
        return None
    if result.stopped_by == "already_complete":
        # Only rank 0 sees the folder: every rank learns whether to write it again.
        rewrite = dist.is_root and not results.is_complete(folder)
        if not dist.broadcast_object(rewrite):
            return folder if dist.is_root else None
    evaluation = final_evaluation()
    weights = results.full_state_dict(result.model, dist.sharded_state, dist.is_root)
    if not dist.is_root:
        return None
    results.write(
        folder,
        weights,
        config=cfg.to_dict(),
        summary=result.summary(),
        evaluation=results.evaluation_summary(
            evaluation, result.step, cfg.language_model, result.unit
        ),
        weights_metadata={"format": "pt", "model": cfg.model, "step": str(result.step)},
    )
    log.info("results written: %s", folder)
    return folder
