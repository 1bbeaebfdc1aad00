"""One optimizer step, one epoch, one evaluation. No globals, no argparse, no ``.cuda()``."""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import torch
from torch import nn

from trainer.engines.base import Dist, GradientProbe
from trainer.training.plugins import Objective


@dataclass
class StepParts:
    """Everything a training step touches."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    # The loss minimised and the samples counted right (trainer.training.plugins: built-in or a
    # team's).
    objective: Objective
    dist: Dist
    device: torch.device
    amp_dtype: torch.dtype | None
    accumulation_steps: int = 1
    clip_norm: float = 0.0  # the gradients' global L2 norm is clipped to this (0: not clipped)
    # --noise-scale-every: the probe the engine's hooks feed, and whether this step measures.
    probe: GradientProbe | None = None
    measure: bool = False
    # --profile-steps: the profiler (trainer.watch.profiling) that learns where each step ends.
    profiler: torch.profiler.profile | None = None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)


@dataclass
class WindowMeter:
    """Sums over a logging window, kept on the device so steps never wait for the host. Its
    averages also report each rank's peak memory and ``cpu_sec``, the CPU seconds a rank's process
    (every thread) spent in the window, both as means over ranks: every rank logs the same
    record. Without a metric (``measured`` False) no accuracy is reported."""

    device: torch.device
    unit: str = "images"  # what one sample is: an image, or a language model's target token
    measured: bool = True
    sums: torch.Tensor = field(init=False)
    images: int = 0
    started: float = field(default_factory=time.monotonic)
    cpu_started: float = field(default_factory=time.process_time)

    def __post_init__(self) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64, device=self.device)

    def add(self, loss_sum: torch.Tensor, correct: torch.Tensor, count: int) -> None:
        self.sums[0] += loss_sum.double()
        self.sums[1] += correct.double()
        self.sums[2] += count
        self.images += count

    def reduce(self, dist: Dist) -> dict[str, float]:
        """Average over every rank's samples (a collective: every rank must call it)."""
        rate = self.images / max(time.monotonic() - self.started, 1e-9)
        cpu_sec = time.process_time() - self.cpu_started
        extra = torch.tensor([rate, peak_memory_gb(self.device), cpu_sec], dtype=torch.float64)
        packed = torch.cat([self.sums, extra.to(self.device)])
        loss_sum, correct, count, total_rate, memory, cpu = dist.allreduce_sum(packed).tolist()
        self.sums.zero_()
        self.images = 0
        self.started = time.monotonic()
        self.cpu_started = time.process_time()
        accuracy = {"accuracy": correct / max(count, 1)} if self.measured else {}
        return {
            "loss": loss_sum / max(count, 1),
            **accuracy,
            f"{self.unit}_per_sec": total_rate / dist.size,
            f"{self.unit}_per_sec_total": total_rate,
            "peak_memory_gb": memory / dist.size,
            "cpu_sec": cpu / dist.size,
        }


def peak_memory_gb(device: torch.device) -> float:
    """This rank's peak memory so far: the GPU memory torch allocated on a GPU; on a CPU the
    process's peak resident set (which includes torch's own libraries, about half a GB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB


def train_step(
    parts: StepParts, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Forward/backward over ``accumulation_steps`` micro-batches, then one optimizer step.

    Returns the summed loss, correct predictions and sample count (device tensors, no sync).
    A sample is an image (logits [batch, classes], labels [batch]), for a language model one
    target token (logits [batch, time, vocabulary], labels [batch, time]), or a plug-in
    dataset's (input, target) pair; ``parts.objective`` says how each is scored.
    """
    objective = parts.objective
    probe = parts.probe if parts.measure else None
    if probe is not None:
        probe.start()
    loss_sum = torch.zeros((), device=parts.device)
    correct = torch.zeros((), device=parts.device, dtype=torch.long)
    count = 0
    last = len(micro_batches) - 1
    for i, (images, labels) in enumerate(micro_batches):
        # DDP: reduce gradients only on the last micro-batch (Horovod counts backward passes).
        sync = contextlib.nullcontext() if i == last else parts.dist.no_sync(parts.model)
        with sync:
            with parts.autocast():
                logits = parts.model(images)
                loss = objective.loss(logits, labels)
            parts.scaler.scale(loss / len(micro_batches)).backward()
        samples = objective.count(labels)
        loss_sum += loss.detach().float() * samples
        if objective.correct is not None:
            correct += objective.correct(logits.detach(), labels).to(correct.dtype)
        count += samples
    parts.dist.optimizer_step(parts.optimizer, parts.scaler, parts.clip_norm, probe)
    parts.optimizer.zero_grad()  # set_to_none by default; Horovod's override takes no args
    parts.scheduler.step()
    return loss_sum, correct, count


def train_one_epoch(
    parts: StepParts,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    meter: WindowMeter,
    after_step: Callable[[], bool],
) -> None:
    """Train until the batches run out or ``after_step`` returns False.

    A trailing group smaller than ``accumulation_steps`` is dropped so that every optimizer
    step sees the same number of samples on every rank.
    """
    parts.model.train()
    iterator = iter(batches)
    while True:
        group = list(islice(iterator, parts.accumulation_steps))
        if len(group) < parts.accumulation_steps:
            return
        meter.add(*train_step(parts, group))
        if not after_step():
            return
        # Here, not before the next batch is read: a profiled step includes reading its batch
        # (an epoch's first step also the evaluation and checkpoint of the epoch before, and
        # the start of its own data iteration).
        if parts.profiler is not None:
            parts.profiler.step()


@torch.no_grad()
def evaluate(
    parts: StepParts, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, float]:
    """Loss and accuracy (top-1, or the plug-in metric's; none without a metric) over every
    rank's validation shard, and the samples (images, a language model's target tokens, a
    plug-in dataset's samples) they cover."""
    parts.model.eval()
    objective = parts.objective
    sums = torch.zeros(3, dtype=torch.float64, device=parts.device)
    for images, labels in batches:
        with parts.autocast():
            logits = parts.model(images)
            loss = objective.loss(logits, labels)
        samples = objective.count(labels)
        sums[0] += loss.double() * samples
        if objective.correct is not None:
            sums[1] += objective.correct(logits, labels).double()
        sums[2] += samples
    loss_sum, correct, count = parts.dist.allreduce_sum(sums).tolist()
    parts.model.train()
    accuracy = {"val_accuracy": correct / max(count, 1)} if objective.correct is not None else {}
    return {"val_loss": loss_sum / max(count, 1), **accuracy, "val_samples": int(count)}
