"""Optimizers, learning-rate scaling and the schedule: the numbers that make large batches work.

- Scaling: Goyal et al. 2017 ("Accurate, Large Minibatch SGD") scale the single-worker rate
  linearly with the number of workers; sqrt scaling (Krizhevsky 2014) suits adaptive optimizers.
  Every engine averages gradients over all workers, so the rule counts them all.
- Warmup: the rate ramps linearly from the single-worker rate to the scaled rate over the first
  epochs (Goyal et al., section 2.2), then decays by steps, a cosine or a polynomial.
- LARS: You, Gitman and Ginsburg 2017, the layer-wise trust ratio that trains ResNet-50 with
  batches of 32k; like NVIDIA's and MLPerf's implementations, BN and bias parameters are
  neither decayed nor adapted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainer.settings.train_config import TrainConfig


def scaled_lr(base_lr: float, rule: str, world_size: int) -> float:
    """The peak learning rate for ``world_size`` workers under a scaling rule."""
    if rule == "linear":
        return base_lr * world_size
    if rule == "sqrt":
        return base_lr * math.sqrt(world_size)
    if rule == "none":
        return base_lr
    raise ValueError(f"unknown lr scaling rule {rule!r}")


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate at every optimizer step; pure, so it is tested directly."""

    start_lr: float
    peak_lr: float
    warmup_steps: int
    total_steps: int
    decay: str
    steps_per_epoch: int
    step_epochs: tuple[int, ...] = ()
    step_factor: float = 0.1
    poly_power: float = 2.0

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.start_lr + (self.peak_lr - self.start_lr) * step / self.warmup_steps
        if self.decay == "step":
            epoch = step // self.steps_per_epoch
            passed = sum(1 for e in self.step_epochs if epoch >= e)
            return self.peak_lr * self.step_factor**passed
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.decay == "cosine":
            return self.peak_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
        if self.decay == "poly":
            return self.peak_lr * (1.0 - progress) ** self.poly_power
        raise ValueError(f"unknown decay {self.decay!r}")


def build_schedule(
    cfg: TrainConfig, steps_per_epoch: int, total_steps: int, scale_factor: int
) -> LRSchedule:
    return LRSchedule(
        start_lr=cfg.lr,
        peak_lr=scaled_lr(cfg.lr, cfg.lr_scaling, scale_factor),
        warmup_steps=round(cfg.warmup_epochs * steps_per_epoch),
        total_steps=total_steps,
        decay=cfg.lr_decay,
        steps_per_epoch=steps_per_epoch,
        step_epochs=cfg.lr_step_epochs,
        step_factor=cfg.lr_step_factor,
        poly_power=cfg.lr_poly_power,
    )


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, schedule: LRSchedule, start_step: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over the schedule, positioned at ``start_step`` (the next step's rate is set).

    The schedule owns the rate: the optimizer is built at ``schedule.lr_at(start_step)`` and
    the scheduler sets every group's rate to ``peak * fraction(step)`` from here on, the
    fraction being the lambda. ``initial_lr``, what LambdaLR multiplies, is the peak. A resumed
    run builds a new scheduler at its position rather than loading the saved one: the saved
    ``base_lrs`` (and the optimizer's saved ``lr``/``initial_lr``) hold the peak of the world
    size that wrote the checkpoint, and LambdaLR would multiply the new fraction by that old
    peak. Built here, the peak always follows the current world size; on an unchanged size the
    rates equal the uninterrupted run's bit for bit (the same ``peak * fraction(step)``).
    """
    for group in optimizer.param_groups:
        group["initial_lr"] = schedule.peak_lr

    # A plain function, not a callable object: LambdaLR saves callable objects' __dict__ into
    # its state_dict, which weights-only checkpoint loading rightly refuses to unpickle.
    def fraction_of_peak(step: int) -> float:
        return schedule.lr_at(step) / schedule.peak_lr

    # last_epoch is the step before the next one: the constructor's own step() advances it.
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fraction_of_peak, last_epoch=start_step - 1)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Split parameters so BN weights and all biases get no weight decay (and no LARS adaptation).

    Decaying them hurts accuracy at large batch sizes (Goyal et al.; Jia et al. 2018).
    """
    decay, no_decay = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            is_norm = isinstance(
                module, nn.modules.batchnorm._NormBase | nn.GroupNorm | nn.LayerNorm
            )
            (no_decay if is_norm or name == "bias" else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay, "lars_adapt": True},
        {"params": no_decay, "weight_decay": 0.0, "lars_adapt": False},
    ]


class LARS(torch.optim.Optimizer):
    """SGD with momentum and a per-layer trust ratio (You et al. 2017, eq. 6).

    local_lr = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w||); groups with
    ``lars_adapt=False`` (BN, bias) take the plain SGD step.
    """

    def __init__(
        self,
        params: Iterable[Any],
        # Defaults for every argument: Horovod's DistributedOptimizer re-creates the optimizer
        # from its param groups (which carry the real values) with no other arguments.
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        eps: float = 1e-9,
    ) -> None:
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            trust_coefficient=trust_coefficient,
            eps=eps,
            lars_adapt=True,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            wd, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = p.grad
                if group["lars_adapt"]:
                    w_norm = torch.linalg.vector_norm(p)
                    g_norm = torch.linalg.vector_norm(update)
                    trust = torch.where(
                        (w_norm > 0) & (g_norm > 0),
                        group["trust_coefficient"] * w_norm / (g_norm + wd * w_norm + group["eps"]),
                        torch.ones_like(w_norm),
                    )
                    update = (update + wd * p) * trust
                elif wd:
                    update = update + wd * p
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = update.detach().clone()
                else:
                    buf.mul_(momentum).add_(update)
                p.add_(buf, alpha=-group["lr"])
        return loss


def build_optimizer(
    cfg: TrainConfig, model: nn.Module, lr: float | None = None
) -> torch.optim.Optimizer:
    """The configured optimizer at rate ``lr``: the schedule's rate at the step training starts
    from (``LRSchedule.lr_at``); ``cfg.lr``, the single-worker rate, when no schedule is given."""
    lr = cfg.lr if lr is None else lr
    groups = parameter_groups(model, cfg.weight_decay)
    if cfg.optimizer == "sgd":
        for g in groups:
            g.pop("lars_adapt")
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=False)
    if cfg.optimizer == "adamw":
        for g in groups:
            g.pop("lars_adapt")
        return torch.optim.AdamW(groups, lr=lr)
    if cfg.optimizer == "lars":
        return LARS(
            groups,
            lr=lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            trust_coefficient=cfg.lars_trust_coefficient,
        )
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")
