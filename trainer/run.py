"""The training run: set up from a config, resume if a checkpoint exists, train, report.

Everything here runs on every rank; only rank 0 reads and writes files.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer import checkpoint, preflight
from trainer.config import ConfigError, TrainConfig
from trainer.data import build_loaders
from trainer.distributed import Dist
from trainer.loop import StepParts, WindowMeter, evaluate, train_one_epoch
from trainer.metrics import MetricsWriter, Progress
from trainer.model import build_model
from trainer.optim import (
    LRSchedule,
    build_lr_scheduler,
    build_optimizer,
    build_schedule,
    lr_scale_factor,
)
from trainer.signals import StopRequest

log = logging.getLogger(__name__)
# Where each checkpoint went and who wrote it (on Batch the task's non-admin user, on the shared
# runs folder): python -m infra.acceptance reads this line from the job's log.
CHECKPOINT_WRITTEN = "checkpoint written: %s (uid %d)"

# Settings that change what a checkpoint's tensors mean: resuming across them is refused.
_CHECKPOINT_IDENTITY = ("model", "num_classes", "optimizer")


@dataclass
class RunResult:
    step: int
    epoch: int
    start_step: int
    stopped_by: str
    last_metrics: dict[str, float]
    images_per_sec: float
    images_per_sec_total: float
    model: nn.Module


def select_device(cfg: TrainConfig, dist: Dist) -> torch.device:
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        # One worker per core share: oversubscribed threads make CPU allreduce crawl. An
        # explicit OMP_NUM_THREADS wins (benchmarks pin one thread per worker).
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.local_size))
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device='cuda': no CUDA device is visible; use --device auto or cpu")
    torch.cuda.set_device(dist.local_rank)
    return torch.device("cuda", dist.local_rank)


def resolve_precision(cfg: TrainConfig, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None, channels_last): bf16 and NHWC by default on GPUs only."""
    amp = cfg.amp
    if amp == "auto":
        amp = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "off"
    dtype = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    channels_last = cfg.channels_last == "on" or (
        cfg.channels_last == "auto" and device.type == "cuda"
    )
    return dtype, channels_last


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class _Run:
    """The state of one invocation; split into methods so each phase reads on its own.

    The position of the run, saved in every checkpoint:

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

    def __init__(self, cfg: TrainConfig, dist: Dist, stop: StopRequest) -> None:
        self.cfg, self.dist, self.stop = cfg, dist, stop
        self.output_dir = Path(cfg.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.device = select_device(cfg, dist)
        amp_dtype, channels_last = resolve_precision(cfg, self.device)
        comm_device = self.device if dist.gpu_collectives else torch.device("cpu")
        bandwidth = preflight.check(dist, comm_device, cfg.preflight_min_busbw)
        if bandwidth and dist.is_root:
            log.info("preflight: allreduce bus bandwidth %.2f GB/s", bandwidth.busbw_gbps)

        # The same seed on every rank gives the same initial weights; rank 0's are broadcast
        # anyway, so a rank with a different seed can never silently diverge.
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed + dist.rank)
        self.loaders = build_loaders(
            cfg, dist.rank, dist.size, self.device, channels_last, dist.local_size
        )
        self.steps_per_epoch = self.loaders.batches_per_epoch // cfg.accumulation_steps
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"accumulation_steps={cfg.accumulation_steps}: more than the "
                f"{self.loaders.batches_per_epoch} batches per epoch; lower it"
            )
        self.step = self.epoch = self.step_in_epoch = self.epoch_offset = 0
        self.epoch_world = dist.size

        model = build_model(cfg.model, cfg.num_classes).to(self.device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        optimizer = build_optimizer(cfg, model)
        optimizer = dist.wrap_optimizer(optimizer, model, cfg)
        self.lr_scale = lr_scale_factor(
            dist.size, dist.local_size, cfg.adasum, dist.gpu_collectives
        )
        self.total_steps, self.schedule = self._plan()
        scheduler = build_lr_scheduler(optimizer, self.schedule)
        scaler = torch.amp.GradScaler(self.device.type, enabled=amp_dtype == torch.float16)
        train_model = dist.wrap_model(model, cfg)
        if cfg.compile:
            train_model = torch.compile(train_model)
        self.parts = StepParts(
            model=train_model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            criterion=nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
            dist=dist,
            device=self.device,
            amp_dtype=amp_dtype,
            accumulation_steps=cfg.accumulation_steps,
        )
        self.last_saved_step = -1
        self.writer: MetricsWriter | None = None

    # ------------------------------------------------------------------ resume
    def resume(self) -> None:
        """Rank 0 loads the newest valid checkpoint; its position and state reach every rank."""
        found: dict[str, Any] | None = None
        error = None
        if self.dist.is_root:
            latest = checkpoint.load_latest(self.checkpoint_dir)
            if latest is not None:
                path, state = latest
                error = self._check_compatible(path, state["config"])
                if error is None:
                    self.model.load_state_dict(state["model"])
                    self.parts.optimizer.load_state_dict(state["optimizer"])
                    found = {k: state[k] for k in ("step", "epoch", "scaler", "rng", "world_size")}
                    found["offset"], found["layout"] = checkpoint.epoch_position(state)
                    found["path"] = str(path)
        found, error = self.dist.broadcast_object((found, error))
        if error:
            raise ConfigError(error)
        self.dist.broadcast_training_state(self.model, self.parts.optimizer, found is not None)
        if found is None:
            return
        self.parts.scaler.load_state_dict(found["scaler"])
        self.step, self.epoch = found["step"], found["epoch"]
        self.epoch_offset, self.epoch_world = found["offset"], found["layout"]
        sampler = self.loaders.train.sampler
        sampler.set_epoch(self.epoch, offset=self.epoch_offset, layout_replicas=self.epoch_world)
        steps_left = sampler.batches_left // self.cfg.accumulation_steps
        self.step_in_epoch = self.steps_per_epoch - steps_left
        self.total_steps, self.schedule = self._plan()
        # The rate follows this world size's peak, not the saved scheduler's (see there).
        self.parts.scheduler = build_lr_scheduler(
            self.parts.optimizer,
            self.schedule,
            self.epoch * self.steps_per_epoch + self.step_in_epoch,
        )
        if found["world_size"] == self.dist.size:
            _set_rng_state(found["rng"][self.dist.rank])
        elif self.dist.is_root:
            # Data order and augmentations depend on (seed, epoch, index) only; the RNG
            # streams, which they do not use, start afresh on the new ranks.
            global_batch = sampler.global_batch * self.cfg.accumulation_steps
            dropped = sampler.order_length - self.epoch_offset - steps_left * global_batch
            spread = ""
            if self.cfg.data == "shards" and steps_left and self.epoch_world != self.dist.size:
                spread = (
                    f"; until it ends, ranks read the {self.epoch_world}-worker layout's rest "
                    "across all its shards"
                )
            log.info(
                "resized: checkpoint from %d workers resumed on %d: epoch %d continues at "
                "sample %d of %d with %d steps of %d samples (the last %d dropped), "
                "%d steps per epoch, peak lr %.6g (lr_scaling=%s)%s",
                found["world_size"],
                self.dist.size,
                self.epoch,
                self.epoch_offset,
                sampler.order_length,
                steps_left,
                global_batch,
                max(0, dropped),
                self.steps_per_epoch,
                self.schedule.peak_lr,
                self.cfg.lr_scaling,
                spread,
            )
        self.last_saved_step = self.step
        if self.dist.is_root:
            print(
                f"resumed from {found['path']} at step {self.step} (epoch {self.epoch})", flush=True
            )

    def _plan(self) -> tuple[int, LRSchedule]:
        """The step this run ends at and the LR schedule, from the position and world size."""
        cfg = self.cfg
        left = max(0, (cfg.epochs - self.epoch) * self.steps_per_epoch - self.step_in_epoch)
        total = self.step + left
        if cfg.max_steps is not None:
            total = min(total, cfg.max_steps)
        position = self.epoch * self.steps_per_epoch + self.step_in_epoch
        schedule = build_schedule(
            cfg, self.steps_per_epoch, position + total - self.step, self.lr_scale
        )
        return total, schedule

    def _epoch_end_due(self) -> bool:
        """After a resize, the rest of an epoch can be less than one global batch: no steps
        are left in it, but its evaluation and the epoch count still are."""
        return self.epoch < self.cfg.epochs and self.step_in_epoch >= self.steps_per_epoch

    def _check_compatible(self, path: Path, saved: dict[str, Any]) -> str | None:
        for key in _CHECKPOINT_IDENTITY:
            if saved.get(key) != getattr(self.cfg, key):
                return (
                    f"{key}={getattr(self.cfg, key)!r}: checkpoint {path} was trained with "
                    f"{key}={saved.get(key)!r}; use the same setting or another --output-dir"
                )
        return None

    # ------------------------------------------------------------------ checkpoints and logs
    def save_checkpoint(self) -> None:
        """A collective: gathers every rank's RNG state; rank 0 writes; a failure stops all."""
        rng = self.dist.allgather_object(_rng_state())
        error = None
        if self.dist.is_root:
            state = {
                "config": self.cfg.to_dict(),
                "step": self.step,
                "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch,
                "epoch_offset": self.epoch_offset,
                "epoch_world_size": self.epoch_world,
                "world_size": self.dist.size,
                "model": self.model.state_dict(),
                "optimizer": self.parts.optimizer.state_dict(),
                # Not read back (the schedule is rebuilt at the position); kept for readers
                # of checkpoints written before offsets were recorded.
                "scheduler": self.parts.scheduler.state_dict(),
                "scaler": self.parts.scaler.state_dict(),
                "rng": rng,
            }
            try:
                path = checkpoint.save(
                    self.checkpoint_dir, self.step, state, self.cfg.keep_checkpoints
                )
                log.info(CHECKPOINT_WRITTEN, path, os.getuid())
            except checkpoint.CheckpointError as err:
                error = str(err)
        error = self.dist.broadcast_object(error)
        if error:
            raise checkpoint.CheckpointError(error)
        self.last_saved_step = self.step

    def log(self, record: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.write(record)

    # ------------------------------------------------------------------ training
    def train(self) -> RunResult:
        cfg, dist = self.cfg, self.dist
        start_step = self.step
        if dist.is_root:
            self.writer = MetricsWriter(self.output_dir)
        progress = Progress(start_step, self.total_steps) if dist.is_root else None
        meter = WindowMeter(self.device)
        last: dict[str, float] = {}
        due = self.step < self.total_steps or self._epoch_end_due()
        stopped_by: str | None = None if due else "already_complete"
        global_batch = cfg.batch_size * cfg.accumulation_steps * dist.size
        run_images = 0
        started = time.monotonic()

        def after_step() -> bool:
            nonlocal last, stopped_by, run_images
            self.step += 1
            self.step_in_epoch += 1
            self.epoch_offset += global_batch
            run_images += cfg.batch_size * cfg.accumulation_steps
            signalled = dist.any_rank(self.stop.requested)
            reasons = [
                ("signal", signalled),
                ("max_steps", self.step >= self.total_steps and cfg.max_steps == self.total_steps),
                ("epochs", self.step >= self.total_steps),
                (
                    "run_steps",
                    cfg.run_steps is not None and self.step - start_step >= cfg.run_steps,
                ),
            ]
            final = next((name for name, hit in reasons if hit), None)
            record = None
            if (
                self.step % cfg.log_every == 0
                or final
                or self.step_in_epoch == self.steps_per_epoch
            ):
                last = meter.reduce(dist)
                record = {
                    "kind": "train",
                    "step": self.step,
                    "epoch": self.epoch,
                    "lr": self.parts.optimizer.param_groups[0]["lr"],
                    **last,
                }
                self.log(record)
            if progress is not None:
                progress.update(self.step, record)
            if final:
                stopped_by = final
                return False
            # At an epoch's last step the epoch-end checkpoint (same step, next epoch's start)
            # follows at once: writing this one too would only be overwritten.
            epoch_ends = self.step_in_epoch >= self.steps_per_epoch
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and not epoch_ends:
                self.save_checkpoint()
            return True

        try:
            while (self.step < self.total_steps or self._epoch_end_due()) and stopped_by is None:
                self.loaders.train.sampler.set_epoch(
                    self.epoch, offset=self.epoch_offset, layout_replicas=self.epoch_world
                )
                if self.step_in_epoch < self.steps_per_epoch:
                    train_one_epoch(self.parts, self.loaders.train, meter, after_step)
                if self.step_in_epoch >= self.steps_per_epoch:
                    if self.loaders.val is not None:
                        self.loaders.val.set_epoch(self.epoch)
                        self.log(
                            {
                                "kind": "eval",
                                "step": self.step,
                                "epoch": self.epoch,
                                **evaluate(self.parts, self.loaders.val),
                            }
                        )
                    self.epoch += 1
                    self.step_in_epoch = self.epoch_offset = 0
                    self.epoch_world = dist.size
                    self.save_checkpoint()
            if self.last_saved_step != self.step:
                self.save_checkpoint()
        finally:
            if progress is not None:
                progress.close()
            if self.writer is not None:
                self.writer.close()

        elapsed = max(time.monotonic() - started, 1e-9)
        total_rate = float(
            dist.allreduce_sum(
                torch.tensor([run_images / elapsed], dtype=torch.float64, device=self.device)
            ).item()
        )
        return RunResult(
            step=self.step,
            epoch=self.epoch,
            start_step=start_step,
            stopped_by=stopped_by or "epochs",
            last_metrics=last,
            images_per_sec=total_rate / dist.size,
            images_per_sec_total=total_rate,
            model=self.model,
        )


def train(cfg: TrainConfig, dist: Dist, stop: StopRequest | None = None) -> RunResult:
    """Train as configured on this rank; resumes from ``<output_dir>/checkpoints`` if present."""
    run = _Run(cfg, dist, stop or StopRequest())
    run.resume()
    return run.train()
