"""The training run: set up from a config, resume if a checkpoint exists, train, report.

Everything here runs on every rank; only rank 0 reads and writes files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer import affinity, checkpoint, preflight, results, sharded_checkpoint
from trainer.background_save import (
    BackgroundWriter,
    HostStaging,
    StepFence,
    cpu_copy,
    snapshot_unguarded,
)
from trainer.config import ConfigError, TrainConfig
from trainer.data import build_loaders
from trainer.distributed import Dist, GradientProbe
from trainer.lm.sizes import GPT_SIZES, flops_per_token
from trainer.lm.throughput import peak_tflops, throughput_metrics
from trainer.loop import StepParts, WindowMeter, evaluate, train_one_epoch
from trainer.metrics import MetricsWriter, Progress
from trainer.model import build_model, checkpoint_activations, sharding_units
from trainer.noise_scale import NoiseScale
from trainer.optim import LRSchedule, build_lr_scheduler, build_optimizer, build_schedule
from trainer.profiling import profiling
from trainer.signals import StopRequest, StopVote

log = logging.getLogger(__name__)
# Where each checkpoint went and who wrote it (on Batch the task's non-admin user, on the shared
# runs folder): python -m infra.tools.acceptance reads this line from the job's log.
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
    # Samples per second: images, or a language model's tokens (``unit``).
    samples_per_sec: float
    samples_per_sec_total: float
    global_batch: int
    # The smoothed gradient noise scale at the end (--noise-scale-every), or None.
    noise_scale: float | None
    unit: str
    model: nn.Module
    # Rank 0's complete results folder (trainer.results) when the run reached its end.
    results: Path | None = None
    # Images replaced because they did not decode (--on-bad-image skip), over every rank.
    skipped_images: int = 0

    def summary(self) -> dict[str, Any]:
        """The run's figures as JSON values (results/metrics.json)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("model", "results")
        }


def select_device(cfg: TrainConfig, dist: Dist) -> torch.device:
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        share = None
        if cfg.cpu_affinity != "off":
            share = affinity.bind_local_rank(dist.local_rank, dist.local_size)
        # One worker per core share: oversubscribed threads make CPU allreduce crawl. An
        # explicit OMP_NUM_THREADS wins (benchmarks pin one thread per worker).
        if "OMP_NUM_THREADS" not in os.environ:
            threads = len(share) if share else (os.cpu_count() or 1) // dist.local_size
            torch.set_num_threads(max(1, threads))
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device='cuda': no CUDA device is visible; use --device auto or cpu")
    torch.cuda.set_device(dist.local_rank)
    if cfg.cpu_affinity == "on":
        affinity.bind_local_rank(dist.local_rank, dist.local_size)
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
        ``checkpoint.epoch_position``)."""
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.step_in_epoch = int(state["step_in_epoch"])
        self.epoch_offset, self.epoch_world = checkpoint.epoch_position(state)


# Checkpoint entries that reach the other ranks as tensors (``Dist.broadcast_training_state``),
# not in the pickled broadcast of the rest of the checkpoint.
_TENSOR_ENTRIES = ("model", "optimizer")


class _Run:
    """The state of one invocation; split into methods so each phase reads on its own. What a
    checkpoint holds is written by ``state_dict()`` and read back by ``load_state_dict()``."""

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
            cfg, dist.rank, dist.size, self.device, channels_last, dist.local_size, dist
        )
        self.steps_per_epoch = self.loaders.batches_per_epoch // cfg.accumulation_steps
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"accumulation_steps={cfg.accumulation_steps}: more than the "
                f"{self.loaders.batches_per_epoch} batches per epoch; lower it"
            )
        self.position = RunPosition(epoch_world=dist.size)

        # A language model's outputs are its data's vocabulary.
        outputs = self.loaders.vocab_size or cfg.num_classes
        # Sharded engines build the model in host memory: fully_shard moves each block to the
        # GPU as it cuts it into shards, so the whole model never has to fit on one GPU.
        model = build_model(cfg.model, outputs)
        if not dist.sharded_state:
            model = model.to(self.device)
        self.unit = "tokens" if cfg.language_model else "images"
        # Samples of one batch: images, or target tokens (the batch's windows x context).
        self.samples_per_batch = cfg.batch_size
        self.flops_per_token = 0
        if cfg.language_model:
            size = GPT_SIZES[cfg.model]
            self.samples_per_batch = cfg.batch_size * (cfg.context or size.context)
            self.flops_per_token = flops_per_token(size, outputs)
        self.peak_tflops = (
            peak_tflops(torch.cuda.get_device_name(self.device))
            if self.device.type == "cuda"
            else None
        )
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        if cfg.activation_checkpointing:
            checkpoint_activations(sharding_units(model))
        self.model = model
        # --noise-scale-every: the engine's reduction hooks show the probe each local gradient.
        probe = GradientProbe(self.device) if cfg.noise_scale_every else None
        self.noise_scale: NoiseScale | None = None
        if probe is not None:
            if dist.size < 2:  # one worker's gradient is the reduced gradient: no second batch
                raise ConfigError(
                    f"noise_scale_every={cfg.noise_scale_every} with 1 worker: the noise scale "
                    "compares each worker's gradient with their average; run 2 or more workers "
                    "or set noise_scale_every=0"
                )
            per_worker = cfg.batch_size * cfg.accumulation_steps
            self.noise_scale = NoiseScale(per_worker, per_worker * dist.size)
        # Wrapped before the optimizer exists: FSDP replaces the parameters with their shards,
        # and the optimizer must step on those.
        train_model = dist.wrap_model(model, cfg, probe)
        self.lr_scale = dist.size  # gradients are averaged over every worker
        self.total_steps, self.schedule = self._plan()
        # The optimizer starts at the schedule's rate; the scheduler moves it from there.
        start = self.position.schedule_step(self.steps_per_epoch)
        optimizer = build_optimizer(cfg, model, lr=self.schedule.lr_at(start))
        optimizer = dist.wrap_optimizer(optimizer, model, cfg, probe)
        scheduler = build_lr_scheduler(optimizer, self.schedule, start)
        scaler = torch.amp.GradScaler(self.device.type, enabled=amp_dtype == torch.float16)
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
            clip_norm=cfg.grad_clip_norm,
            probe=probe,
        )
        self.last_saved_step = -1
        self.saves = BackgroundWriter()
        # A background save's copy overlaps the next step; that step's optimizer.step() waits
        # for it. Single-file saves copy into our staging tensors, sharded ones with DCP's stager.
        self.fence = StepFence(optimizer)
        self.staging = HostStaging(self.fence, self.device)
        self.dcp_stager = (
            sharded_checkpoint.background_stager(self.device)
            if dist.sharded_state and cfg.checkpoint_async
            else None
        )
        self.writer: MetricsWriter | None = None
        # The last evaluation: (step, trainer.loop.evaluate's figures).
        self.last_eval: tuple[int, dict[str, float]] | None = None

    # ------------------------------------------------------------------ run state
    def state_dict(self, rng: list[dict[str, Any]]) -> dict[str, Any]:
        """What a checkpoint holds; ``rng`` is every rank's RNG state, in rank order."""
        return {
            **self.trainer_state(rng),
            "model": self.model.state_dict(),
            "optimizer": self.parts.optimizer.state_dict(),
        }

    def trainer_state(self, rng: list[dict[str, Any]]) -> dict[str, Any]:
        """A checkpoint's entries other than the model's and optimizer's tensors (a sharded
        checkpoint keeps those in every rank's shards)."""
        return {
            "config": self.cfg.to_dict(),
            **self.position.state_dict(),
            "world_size": self.dist.size,
            # Not read back (the schedule is rebuilt at the position); kept for readers
            # of checkpoints written before offsets were recorded.
            "scheduler": self.parts.scheduler.state_dict(),
            "scaler": self.parts.scaler.state_dict(),
            "rng": rng,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint on this rank. Rank 0 passes the whole checkpoint; the other
        ranks pass it without ``_TENSOR_ENTRIES``, which ``broadcast_training_state`` brings
        them. ``resume`` then rebuilds the LR schedule at the position."""
        if "model" in state:
            self.model.load_state_dict(state["model"])
            self.parts.optimizer.load_state_dict(state["optimizer"])
        self.position.load_state_dict(state)
        self.parts.scaler.load_state_dict(state["scaler"])
        if int(state["world_size"]) == self.dist.size:
            _set_rng_state(state["rng"][self.dist.rank])
        # Otherwise the RNG streams start afresh on the new ranks: data order and augmentations
        # depend on (seed, epoch, index) only, not on them.

    # ------------------------------------------------------------------ resume
    def resume(self) -> None:
        """Rank 0 finds the newest valid checkpoint; its position and state reach every rank
        (the tensors by broadcast, or with sharded state from each rank's own shards)."""
        shared: dict[str, Any] | None = None
        path = error = None
        if self.dist.is_root:
            latest = self._latest_checkpoint()
            if latest is not None:
                path, state = latest
                error = self._check_compatible(path, state["config"])
                if error is None:
                    shared = {k: v for k, v in state.items() if k not in _TENSOR_ENTRIES}
                    if not self.dist.sharded_state:
                        self.load_state_dict(state)
        shared, path, error = self.dist.broadcast_object((shared, path, error))
        if error:
            raise ConfigError(error)
        if self.dist.sharded_state:
            if shared is None:
                return
            self._load_shards(path)
            self.load_state_dict(shared)
        else:
            self.dist.broadcast_training_state(self.model, self.parts.optimizer, shared is not None)
            if shared is None:
                return
            if not self.dist.is_root:
                self.load_state_dict(shared)
        pos = self.position
        sampler = self.loaders.train.sampler
        sampler.set_epoch(pos.epoch, offset=pos.epoch_offset, layout_replicas=pos.epoch_world)
        steps_left = sampler.batches_left // self.cfg.accumulation_steps
        pos.step_in_epoch = self.steps_per_epoch - steps_left
        self.total_steps, self.schedule = self._plan()
        # The rate follows this world size's peak, not the saved scheduler's (see there).
        self.parts.scheduler = build_lr_scheduler(
            self.parts.optimizer, self.schedule, pos.schedule_step(self.steps_per_epoch)
        )
        saved_world = int(shared["world_size"])
        if saved_world != self.dist.size and self.dist.is_root:
            global_batch = sampler.global_batch * self.cfg.accumulation_steps
            dropped = sampler.order_length - pos.epoch_offset - steps_left * global_batch
            spread = ""
            if self.cfg.data == "shards" and steps_left and pos.epoch_world != self.dist.size:
                spread = (
                    f"; until it ends, ranks read the {pos.epoch_world}-worker layout's rest "
                    "across all its shards"
                )
            log.info(
                "resized: checkpoint from %d workers resumed on %d: epoch %d continues at "
                "sample %d of %d with %d steps of %d samples (the last %d dropped), "
                "%d steps per epoch, peak lr %.6g (lr_scaling=%s)%s",
                saved_world,
                self.dist.size,
                pos.epoch,
                pos.epoch_offset,
                sampler.order_length,
                steps_left,
                global_batch,
                max(0, dropped),
                self.steps_per_epoch,
                self.schedule.peak_lr,
                self.cfg.lr_scaling,
                spread,
            )
        self.last_saved_step = pos.step
        if self.dist.is_root:
            print(f"resumed from {path} at step {pos.step} (epoch {pos.epoch})", flush=True)

    def _plan(self) -> tuple[int, LRSchedule]:
        """The step this run ends at and the LR schedule, from the position and world size."""
        cfg, pos = self.cfg, self.position
        left = max(0, (cfg.epochs - pos.epoch) * self.steps_per_epoch - pos.step_in_epoch)
        total = pos.step + left
        if cfg.max_steps is not None:
            total = min(total, cfg.max_steps)
        end = pos.schedule_step(self.steps_per_epoch) + total - pos.step
        return total, build_schedule(cfg, self.steps_per_epoch, end, self.lr_scale)

    def _epoch_end_due(self) -> bool:
        """After a resize, the rest of an epoch can be less than one global batch: no steps
        are left in it, but its evaluation and the epoch count still are."""
        return (
            self.position.epoch < self.cfg.epochs
            and self.position.step_in_epoch >= self.steps_per_epoch
        )

    def _check_compatible(self, path: Path, saved: dict[str, Any]) -> str | None:
        for key in _CHECKPOINT_IDENTITY:
            if saved.get(key) != getattr(self.cfg, key):
                return (
                    f"{key}={getattr(self.cfg, key)!r}: checkpoint {path} was trained with "
                    f"{key}={saved.get(key)!r}; use the same setting or another --output-dir"
                )
        return None

    # ------------------------------------------------------------------ checkpoints and logs
    def _latest_checkpoint(self) -> tuple[Path, dict[str, Any]] | None:
        """Rank 0: the newest checkpoint that loads, with its trainer state (and, single-file,
        its tensors); unreadable ones are skipped with a warning."""
        if self.dist.sharded_state:
            return sharded_checkpoint.load_latest_trainer_state(self.checkpoint_dir)
        return checkpoint.load_latest(self.checkpoint_dir)

    def _sharded_tensors(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.parts.optimizer)
        return {"model": model, "optimizer": optimizer}

    def _load_shards(self, path: Path) -> None:
        """Every rank: its shards of the model and optimizer from ``path``, resharded by DCP
        when another number of ranks wrote them."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        tensors = self._sharded_tensors()
        sharded_checkpoint.read_shards(path, tensors)
        set_state_dict(
            self.model,
            self.parts.optimizer,
            model_state_dict=tensors["model"],
            optim_state_dict=tensors["optimizer"],
        )

    def _agree(self, error: str | None) -> None:
        """Every rank learns whether any rank's save failed, and the failure rank 0 saw (a
        collective); then every rank raises it."""
        if self.dist.any_rank(error is not None):
            first = self.dist.broadcast_object(error)
            raise checkpoint.CheckpointError(
                first or "cannot write a checkpoint: another rank failed (its log says why)"
            )

    def _finish_saves(self) -> None:
        """Wait for the write in flight, if any; its failure stops every rank (a collective)."""
        self._agree(self.saves.wait())

    def save_checkpoint(self, *, final: bool = False) -> None:
        """A collective. Waits for the write in flight, takes a copy of the state (the stall
        training sees; in the background, the optimizer's state and parameters are copied while
        the next step runs, see ``StepFence``) and writes it, in the background unless
        ``--no-checkpoint-async`` or ``final`` (the run's last save returns once its bytes are
        on disk). Rank 0 writes a single-file checkpoint; with sharded state every rank writes
        its shards. A failure on any rank stops all."""
        started = time.monotonic()
        self._finish_saves()
        rng = self.dist.allgather_object(_rng_state())
        background = self.cfg.checkpoint_async and not final
        if self.dist.sharded_state:
            self._start_sharded_save(rng, background)
        else:
            self._start_full_save(rng, background)
        if not background:
            self._finish_saves()
        self.last_saved_step = self.position.step
        stall = time.monotonic() - started
        self.log(
            {"kind": "checkpoint", "step": self.position.step, "stall_sec": stall},
        )

    def _start_full_save(self, rng: list[dict[str, Any]], background: bool) -> None:
        if not self.dist.is_root:
            return
        state = self.state_dict(rng)
        # In the background the next steps change the live tensors while a copy is written.
        copy = self.staging.stage(state) if background else None
        folder, step, keep = self.checkpoint_dir, self.position.step, self.cfg.keep_checkpoints

        def write() -> None:
            path = checkpoint.save(folder, step, state if copy is None else copy.result(), keep)
            log.info(CHECKPOINT_WRITTEN, path, os.getuid())

        self.saves.submit(write)

    def _start_sharded_save(self, rng: list[dict[str, Any]], background: bool) -> None:
        path = sharded_checkpoint.checkpoint_path(self.checkpoint_dir, self.position.step)
        error = None
        if self.dist.is_root:
            try:
                sharded_checkpoint.prepare_folder(path)
            except OSError as err:
                error = str(sharded_checkpoint.save_error(path, err))
        self._agree(error)
        try:
            tensors, staging = self._sharded_tensors(), None
            if background:
                # What the optimizer's step does not change (buffers forward updates) is copied
                # now; DCP copies the rest to host memory while the next step runs.
                tensors = snapshot_unguarded(tensors, self.fence.guarded())
                staging = (self.dist.background_group, self.dcp_stager)
            pending = sharded_checkpoint.start_writing(path, tensors, staging)
            if pending is not None:
                self.fence.hold(pending[0])
        except Exception as err:
            error = str(sharded_checkpoint.save_error(path, err))
        self._agree(error)
        state = cpu_copy(self.trainer_state(rng)) if self.dist.is_root else None
        keep = self.cfg.keep_checkpoints

        def write() -> None:
            try:
                if pending is not None:
                    pending[1].result()  # every rank's shards and DCP's metadata are written
                if state is not None:  # rank 0: the trainer state, then the marker
                    sharded_checkpoint.complete(path, state, keep)
                    log.info(CHECKPOINT_WRITTEN, path, os.getuid())
            except Exception as err:
                raise sharded_checkpoint.save_error(path, err) from None

        self.saves.submit(write)

    def _measure_noise_scale(self, step: int, global_batch: int) -> float | None:
        """After a measuring step: the workers' mean squared local gradient norm (a collective)
        and the reduced one into the estimate; logged; B_simple once it is defined."""
        probe, estimate = self.parts.probe, self.noise_scale
        assert probe is not None and estimate is not None
        local_sq = self.dist.allreduce_sum(probe.local_sq).item() / self.dist.size
        record = estimate.update(local_sq, probe.reduced_sq.item())
        self.log({"kind": "noise", "step": step, "global_batch": global_batch, **record})
        return record.get("noise_scale")

    def _skipped_images(self) -> int:
        """Images replaced because they did not decode, over every rank: a collective with
        --on-bad-image skip; with fail none is ever replaced (the first stops the run)."""
        if self.cfg.on_bad_image != "skip":
            return 0
        count = torch.tensor(
            [self.loaders.bad_images.skipped], dtype=torch.float64, device=self.device
        )
        return int(self.dist.allreduce_sum(count).item())

    def log(self, record: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.write(record)

    # ------------------------------------------------------------------ training
    def train(self) -> RunResult:
        cfg, dist, pos = self.cfg, self.dist, self.position
        start_step = pos.step
        if dist.is_root:
            self.writer = MetricsWriter(self.output_dir)
        progress = Progress(start_step, self.total_steps, unit=self.unit) if dist.is_root else None
        meter = WindowMeter(self.device, self.unit)
        last: dict[str, float] = {}
        due = pos.step < self.total_steps or self._epoch_end_due()
        stopped_by: str | None = None if due else "already_complete"
        global_batch = cfg.batch_size * cfg.accumulation_steps * dist.size
        run_samples = 0
        noise_scale: float | None = None
        started = time.monotonic()
        every = cfg.noise_scale_every
        self.parts.measure = bool(every) and (pos.step + 1) % every == 0

        def after_step() -> bool:
            nonlocal last, stopped_by, run_samples, noise_scale
            if self.parts.measure:
                noise_scale = self._measure_noise_scale(pos.step + 1, global_batch) or noise_scale
            self.parts.measure = bool(every) and (pos.step + 2) % every == 0
            pos.step += 1
            pos.step_in_epoch += 1
            pos.epoch_offset += global_batch
            run_samples += self.samples_per_batch * cfg.accumulation_steps
            signalled = stop_vote.next()
            reasons = [
                ("signal", signalled),
                ("max_steps", pos.step >= self.total_steps and cfg.max_steps == self.total_steps),
                ("epochs", pos.step >= self.total_steps),
                (
                    "run_steps",
                    cfg.run_steps is not None and pos.step - start_step >= cfg.run_steps,
                ),
            ]
            final = next((name for name, hit in reasons if hit), None)
            record = None
            if pos.step % cfg.log_every == 0 or final or pos.step_in_epoch == self.steps_per_epoch:
                last = meter.reduce(dist)
                if cfg.on_bad_image == "skip":
                    last["skipped_images"] = self._skipped_images()
                if self.flops_per_token:
                    last.update(
                        throughput_metrics(
                            last["tokens_per_sec"], self.flops_per_token, self.peak_tflops
                        )
                    )
                record = {
                    "kind": "train",
                    "step": pos.step,
                    "epoch": pos.epoch,
                    "lr": self.parts.optimizer.param_groups[0]["lr"],
                    **last,
                }
                self.log(record)
            if progress is not None:
                progress.update(pos.step, record)
            if final:
                stopped_by = final
                return False
            # At an epoch's last step the epoch-end checkpoint (same step, next epoch's start)
            # follows at once: writing this one too would only be overwritten.
            epoch_ends = pos.step_in_epoch >= self.steps_per_epoch
            if cfg.checkpoint_every and pos.step % cfg.checkpoint_every == 0 and not epoch_ends:
                self.save_checkpoint()
            return True

        # --profile-steps: the profiler runs until the finally below, which writes the trace of
        # a run that stopped inside the window.
        profiler = contextlib.ExitStack()
        self.parts.profiler = profiler.enter_context(
            profiling(
                cfg.profile_steps,
                self.output_dir,
                dist.rank,
                self.device,
                pos.step,
                self.total_steps,
            )
        )
        stop_vote = StopVote(dist, self.stop)
        try:
            while (pos.step < self.total_steps or self._epoch_end_due()) and stopped_by is None:
                self.loaders.train.sampler.set_epoch(
                    pos.epoch, offset=pos.epoch_offset, layout_replicas=pos.epoch_world
                )
                if pos.step_in_epoch < self.steps_per_epoch:
                    train_one_epoch(self.parts, self.loaders.train, meter, after_step)
                if pos.step_in_epoch >= self.steps_per_epoch:
                    if self.loaders.val is not None:
                        self.loaders.val.set_epoch(pos.epoch)
                        self.last_eval = (pos.step, evaluate(self.parts, self.loaders.val))
                        self.log(
                            {
                                "kind": "eval",
                                "step": pos.step,
                                "epoch": pos.epoch,
                                **self.last_eval[1],
                            }
                        )
                    pos.epoch += 1
                    pos.step_in_epoch = pos.epoch_offset = 0
                    pos.epoch_world = dist.size
                    self.save_checkpoint()
            stop_vote.close()  # the vote the last step started, which no step reads
            if self.last_saved_step != pos.step:
                self.save_checkpoint(final=True)
            else:  # the epoch-end save, maybe still in flight
                self._finish_saves()
        finally:
            profiler.close()
            # An error ended the run: a write in flight still finishes (it is atomic and
            # complete, or it is never loaded); nothing waits for the other ranks any more.
            self.saves.close()
            self.staging.close()
            if self.dcp_stager is not None:
                self.dcp_stager.close()
            if progress is not None:
                progress.close()
            if self.writer is not None:
                self.writer.close()

        elapsed = max(time.monotonic() - started, 1e-9)
        total_rate = float(
            dist.allreduce_sum(
                torch.tensor([run_samples / elapsed], dtype=torch.float64, device=self.device)
            ).item()
        )
        return RunResult(
            step=pos.step,
            epoch=pos.epoch,
            start_step=start_step,
            stopped_by=stopped_by or "epochs",
            last_metrics=last,
            samples_per_sec=total_rate / dist.size,
            samples_per_sec_total=total_rate,
            unit=self.unit,
            global_batch=global_batch,
            noise_scale=noise_scale,
            skipped_images=self._skipped_images(),
            model=self.model,
        )

    # ------------------------------------------------------------------ results
    def write_results(self, result: RunResult) -> Path | None:
        """Every rank (collectives: the final evaluation, FSDP's gather). At the run's end rank 0
        writes ``results/`` (``trainer.results``) and returns the folder; a paused run (a signal,
        --run-steps) writes none. A run found finished already keeps complete results."""
        folder = self.output_dir / results.RESULTS_DIR
        if result.stopped_by not in (*results.FINISHED, "already_complete"):
            return None
        if result.stopped_by == "already_complete":
            # Only rank 0 sees the folder: every rank learns whether to write it again.
            rewrite = self.dist.is_root and not results.is_complete(folder)
            if not self.dist.broadcast_object(rewrite):
                return folder if self.dist.is_root else None
        evaluation = self._final_evaluation()
        weights = results.full_state_dict(self.model, self.dist.sharded_state, self.dist.is_root)
        if not self.dist.is_root:
            return None
        step = self.position.step
        results.write(
            folder,
            weights,
            config=self.cfg.to_dict(),
            summary=result.summary(),
            evaluation=results.evaluation_summary(
                evaluation, step, self.cfg.language_model, self.unit
            ),
            weights_metadata={"format": "pt", "model": self.cfg.model, "step": str(step)},
        )
        log.info("results written: %s", folder)
        return folder

    def _final_evaluation(self) -> dict[str, float] | None:
        """The evaluation of the final weights: the epoch end's when the run ended there, else
        one more pass over the validation data (a collective); None without validation data."""
        if self.loaders.val is None:
            return None
        if self.last_eval is not None and self.last_eval[0] == self.position.step:
            return self.last_eval[1]
        self.loaders.val.set_epoch(self.position.epoch)
        return evaluate(self.parts, self.loaders.val)


def train(cfg: TrainConfig, dist: Dist, stop: StopRequest | None = None) -> RunResult:
    """Train as configured on this rank; resumes from ``<output_dir>/checkpoints`` if present."""
    run = _Run(cfg, dist, stop or StopRequest())
    run.resume()
    result = run.train()
    result.results = run.write_results(result)
    return result
