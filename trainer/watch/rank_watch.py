"""What the ranks tell rank 0 about themselves every ``--straggler-every`` steps: their step
and data-wait times (``trainer.watch.stragglers``) and their GPU's samples
(``trainer.watch.gpu_telemetry``), in one allreduce. Rank 0 writes ``kind: straggler`` and ``kind:
gpu`` records, per-rank TensorBoard scalars and a warning line when a rank starts to hold the others
up.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch

from trainer.engines.base import Dist
from trainer.outputs.metrics import MetricsWriter
from trainer.settings.train_config import TrainConfig
from trainer.watch.gpu_telemetry import FIELDS, GpuSampler, start_sampler
from trainer.watch.stragglers import TIMES, RankExchange

log = logging.getLogger(__name__)
T = TypeVar("T")


class RankWatch:
    """Built by every rank as the loop begins; every call on it is made by every rank."""

    def __init__(
        self,
        cfg: TrainConfig,
        dist: Dist,
        device: torch.device,
        writer: MetricsWriter | None,
    ) -> None:
        """``writer``: rank 0's metrics (None on the other ranks)."""
        self.dist, self.writer = dist, writer
        self.sampler: GpuSampler | None = None
        self.exchange: RankExchange | None = None
        if not cfg.straggler_every:
            return
        self.sampler = start_sampler(device, cfg.gpu_telemetry_seconds)
        # Every rank sends GPU fields when any might, so the table has one shape everywhere.
        gpu = device.type == "cuda" and bool(cfg.gpu_telemetry_seconds)
        self.exchange = RankExchange(
            dist,
            device,
            cfg.straggler_every,
            cfg.straggler_margin,
            extra=self._gpu_fields if gpu else None,
            extra_width=len(FIELDS) if gpu else 0,
        )

    def _gpu_fields(self) -> list[float]:
        return self.sampler.take() if self.sampler else [math.nan] * len(FIELDS)

    def batches(self, iterable: Iterable[T]) -> Iterable[T] | Iterator[T]:
        """The training batches, their wait timed (unchanged when the watch is off)."""
        return self.exchange.batches(iterable) if self.exchange else iterable

    def step_done(self, step: int) -> None:
        """After every optimizer step; every ``--straggler-every`` steps a collective."""
        if self.exchange is None:
            return
        shared = self.exchange.step_done(step)
        if shared is None or self.writer is None:
            return
        rows, stragglers = shared
        for straggler in self.exchange.news(stragglers):
            log.warning(straggler.line())
        for straggler in stragglers:
            self.writer.write(straggler.record(), tensorboard=False)
        scalars = self.exchange.scalars(rows)
        for rank, row in enumerate(rows):
            gpu = _gpu_record(step, rank, self.exchange.hosts[rank], row[len(TIMES) :])
            if gpu is not None:
                self.writer.write(gpu, tensorboard=False)
                scalars.update(
                    {f"gpu/{k}/rank{rank}": gpu[k] for k in FIELDS if gpu[k] is not None}
                )
        self.writer.scalars(scalars, step)

    def summary(self) -> list[dict[str, Any]]:
        """The run's stragglers (``results/metrics.json`` and rank 0's last lines)."""
        return self.exchange.summary.result() if self.exchange else []

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()


def _gpu_record(step: int, rank: int, host: str, values: list[float]) -> dict[str, Any] | None:
    """A ``kind: gpu`` record for one rank's GPU, or None when it sent no sample."""
    if len(values) < len(FIELDS) or all(math.isnan(v) for v in values):
        return None
    # JSON has no NaN: a reading the GPU does not offer is null.
    readings = {k: None if math.isnan(v) else v for k, v in zip(FIELDS, values, strict=False)}
    return {"kind": "gpu", "step": step, "rank": rank, "host": host, **readings}
