"""Checkpoint writes in the background: training goes on while the bytes reach storage.

A save takes a consistent copy of the state first, inside the step loop (the training-visible
stall: a copy in memory), and a background thread writes that copy: the single-file checkpoint
with ``trainer.checkpoint.save`` (its atomic rename and checksum), or the shards DCP staged
with ``torch.distributed.checkpoint.async_save`` followed by rank 0's completion marker
(``trainer.sharded_checkpoint.complete``). At most one write is in flight: the next save, and
the end of the run (a SIGTERM included), first waits for it, and a write that failed on any rank
stops every rank there with its one-line error.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from trainer.config import first_line


def cpu_copy(value: Any) -> Any:
    """A copy of every tensor in a nested state dict, on the CPU, that later steps cannot
    change (``.cpu()`` alone returns the same storage for a CPU tensor, which the next optimizer
    step would overwrite while it is being written)."""
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(v) for v in value)
    return value


class BackgroundWriter:
    """One background thread; at most one checkpoint write in flight on it."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._in_flight: Future[None] | None = None

    @property
    def busy(self) -> bool:
        return self._in_flight is not None

    def submit(self, write: Callable[[], None]) -> None:
        if self._in_flight is not None:
            raise RuntimeError("a checkpoint write is already in flight; wait() for it first")
        self._in_flight = self._executor.submit(write)

    def wait(self) -> str | None:
        """Block until the write in flight (if any) ends; its error as one line, or None."""
        future, self._in_flight = self._in_flight, None
        if future is None:
            return None
        try:
            future.result()
        except Exception as err:  # reported on every rank by the caller, as one line
            return first_line(err)
        return None

    def close(self) -> None:
        """Finish the write in flight (the process must not exit halfway through a file)."""
        self._executor.shutdown(wait=True)
