"""``Dist``, the interface the trainer uses to talk to the other workers, and what every engine
shares: gradient clipping and the gradient probe (the noise scale's two batch sizes), telling a
dead peer from a bug, leaving without the interpreter's teardown, and the CPU copy a background
save writes. The engines are ``horovod`` (the default), ``ddp`` (torch.distributed), ``fsdp``
(FSDP2: parameters, gradients and optimizer state sharded over the ranks) and ``local`` (one
process); only ``trainer.engines.horovod`` imports ``horovod.torch``, so the rest of the trainer
runs wherever torch does; the node launcher (``trainer.launch``) serves Horovod's rendezvous.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any, NoReturn

import torch
from torch import nn

from trainer.settings.train_config import TrainConfig


def clip_gradients(optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    """Scale every gradient the optimizer steps on so that their global L2 norm is at most
    ``max_norm``; returns the norm before clipping. With FSDP the gradients are DTensor shards
    and torch computes the norm over all of them (every rank gets the same value)."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm)


class GradientProbe:
    """For the gradient noise scale (``trainer.watch.noise_scale``, ``--noise-scale-every``).

    Collects, on measuring steps, this rank's squared gradient norm before the reduction
    (``local``, called by the engine's hook for every gradient or bucket) and after it
    (``record_reduced``, called once the gradients are averaged, before clipping)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.active = False
        self.local_sq = torch.zeros((), dtype=torch.float64, device=device)
        self.reduced_sq = torch.zeros((), dtype=torch.float64, device=device)

    def start(self) -> None:
        self.active = True
        self.local_sq.zero_()
        self.reduced_sq.zero_()

    def local(self, gradients: torch.Tensor) -> None:
        if self.active:
            self.local_sq += gradients.detach().double().pow(2).sum().to(self.device)

    def record_reduced(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.active:
            return
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self.reduced_sq += param.grad.detach().double().pow(2).sum()
        self.active = False


class Dist(ABC):
    """How this worker talks to the others: the interface the trainer uses.

    The collectives are abstract, so a backend that forgets one fails when it is created
    instead of silently doing one process's maths. Every rank must make the same collective
    calls in the same order. The model and optimizer hooks default to one process's behaviour
    (nothing to wrap, nothing to reduce); backends override what their engine needs.
    """

    name: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    # False where the engine's threads may still run at the interpreter's teardown, which they
    # do not survive: the process then ends with exit_without_teardown once its work is done.
    teardown_safe = True

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    @abstractmethod
    def gpu_collectives(self) -> bool:
        """Whether gradients are reduced by NCCL (a plain sum, which LR scaling must count)."""

    # ---------------------------------------------------------------- model and optimizer
    def wrap_model(
        self, model: nn.Module, cfg: TrainConfig, probe: GradientProbe | None = None
    ) -> nn.Module:
        """The model as this engine trains it. ``probe`` (``--noise-scale-every``) is shown
        each local gradient before the engine reduces it, where the engine does that."""
        return model

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        cfg: TrainConfig,
        probe: GradientProbe | None = None,
    ) -> torch.optim.Optimizer:
        return optimizer

    def no_sync(self, model: nn.Module) -> ContextManager[Any]:
        """Context for a micro-batch whose gradients are accumulated, not yet reduced."""
        return contextlib.nullcontext()

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        clip_norm: float,
        probe: GradientProbe | None = None,
    ) -> None:
        """Step on the reduced gradients, clipped to ``clip_norm`` (0: not clipped) after the
        scaler unscaled them; on a measuring step ``probe`` records their norm first."""
        if clip_norm or probe is not None:
            scaler.unscale_(optimizer)  # a no-op when the scaler is disabled
        if probe is not None:
            probe.record_reduced(optimizer)
        if clip_norm:
            clip_gradients(optimizer, clip_norm)
        scaler.step(optimizer)
        scaler.update()

    def take_reduction_wait(self) -> float | None:
        """Seconds this rank waited for the other ranks' gradients since the last call, or
        None where the engine does not show it (DDP and FSDP wait inside backward).
        ``trainer.watch.stragglers`` tells a slow rank from the ranks waiting for it by this."""
        return None

    @property
    def sharded_state(self) -> bool:
        """Whether each rank holds only its shard of the parameters and optimizer state (then
        every rank writes and reads its own part of a checkpoint: ``trainer.checkpoints.sharded``);
        otherwise rank 0 holds the whole state and writes it alone
        (``trainer.checkpoints.single_file``)."""
        return False

    def broadcast_training_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, resuming: bool
    ) -> None:
        """Make every rank start from rank 0's parameters, buffers and optimizer state."""
        self.broadcast_parameters(model)
        if resuming:
            # Pickled rather than hvd.broadcast_optimizer_state: that helper runs a dummy
            # optimizer step on ranks with empty state, which moves parameters under weight
            # decay, and it works per option tensor rather than on the whole state.
            # Copied to the CPU, so a receiving rank never materialises it on rank 0's GPU.
            state = cpu_copy(optimizer.state_dict()) if self.is_root else None
            state = self.broadcast_object(state)
            if not self.is_root:
                optimizer.load_state_dict(state)

    # ---------------------------------------------------------------- collectives
    @abstractmethod
    def broadcast_parameters(self, model: nn.Module) -> None:
        """Overwrite every rank's parameters and buffers with rank 0's."""

    @abstractmethod
    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled)."""

    @abstractmethod
    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""

    @abstractmethod
    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of ``tensor`` over all ranks (a new tensor)."""

    @abstractmethod
    def any_rank(self, flag: bool) -> bool:
        """True on every rank when any rank passes True (used to stop all ranks together)."""

    def any_rank_later(self, flag: bool) -> Callable[[], bool]:
        """``any_rank(flag)`` started now and read by calling what this returns, so that the
        ranks' exchange overlaps the caller's next work instead of stalling it. Every rank
        reads it before starting the next one. One process answers at once."""
        result = self.any_rank(flag)
        return lambda: result

    @abstractmethod
    def barrier(self) -> None:
        """Return when every rank has called it."""

    @abstractmethod
    def shutdown(self) -> None:
        """Leave the group; no collective may follow."""


# What Gloo says when the other end of a collective went away (gloo/transport/tcp/pair.cc); it
# raises a plain RuntimeError, so the message is all there is to tell it from a bug.
_GLOO_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def is_peer_failure(err: BaseException) -> bool:
    """Whether ``err`` is what a worker sees when another worker died: Horovod shuts down its
    collectives; torch.distributed raises its DistError family, or Gloo's RuntimeError."""
    try:
        from horovod.common.exceptions import HorovodInternalError

        if isinstance(err, HorovodInternalError):
            return True
    except ImportError:
        pass
    import torch.distributed as td

    if isinstance(err, (td.DistBackendError, td.DistNetworkError, td.DistStoreError)):
        return True
    return isinstance(err, RuntimeError) and any(text in str(err) for text in _GLOO_PEER_GONE)


def exit_without_teardown(code: int) -> NoReturn:
    """End the process now with ``code``, its output flushed, without the interpreter's teardown
    (``Dist.teardown_safe``): call it once every file is closed and every worker stopped."""
    import logging
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


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
