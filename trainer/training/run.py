"""The training run: set up from a config, resume if a checkpoint exists, train, report.

Everything here runs on every rank; checkpoints are the ``Checkpointer``'s
(``trainer.checkpoints``), other files rank 0's.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoints.cadence import Moment
from trainer.checkpoints.choose import build_checkpointer
from trainer.common.errors import ConfigError
from trainer.engines.base import Dist, GradientProbe, is_peer_failure
from trainer.engines.device import resolve_precision, select_device
from trainer.outputs import results
from trainer.outputs.metrics import MetricsWriter, Progress
from trainer.outputs.tracking import Tracking, tracked
from trainer.settings.train_config import TrainConfig, global_batch
from trainer.training.optim import LRSchedule, build_lr_scheduler, build_optimizer, build_schedule
from trainer.training.plugins import Plugins
from trainer.training.position import RunPosition, rng_state, set_rng_state
from trainer.training.result import RunResult, write_results
from trainer.training.setup import (
    build_run_loaders,
    build_run_model,
    noise_probe,
    start_from_weights,
    throughput_unit,
)
from trainer.training.steps import StepParts, WindowMeter, evaluate, train_one_epoch
from trainer.watch import allreduce_check as preflight
from trainer.watch.mfu import throughput_metrics
from trainer.watch.profiling import profiling
from trainer.watch.rank_watch import RankWatch
from trainer.watch.signals import StopRequest, StopVote
from trainer.watch.watchdog import StepWatchdog

log = logging.getLogger(__name__)


@dataclass
class _Loop:
    """One invocation's training loop: what its steps count and report (``_Run.train``)."""

    start_step: int
    meter: WindowMeter
    progress: Progress | None
    # --profile-steps: the profiler runs until the loop ends, so that it writes the trace of a
    # run that stopped inside the window.
    profiler: contextlib.ExitStack
    stop_vote: StopVote
    started: float
    stopped_by: str | None
    last: dict[str, float] = field(default_factory=dict)
    run_samples: int = 0
    noise_scale: float | None = None


class _Run:
    """The state of one invocation; split into methods so each phase reads on its own. The
    trainer's own part of a checkpoint is written by ``state_dict()`` and read back by
    ``load_state_dict()``; ``self.checkpointer`` holds the model's and optimizer's."""

    def __init__(
        self,
        cfg: TrainConfig,
        dist: Dist,
        stop: StopRequest,
        plugins: Plugins | None = None,
        tracking: Tracking | None = None,
    ) -> None:
        self.cfg, self.dist, self.stop, self.tracking = cfg, dist, stop, tracking
        self.plugins = plugins or Plugins()
        self.output_dir = Path(cfg.output_dir)
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
        self.loaders = build_run_loaders(cfg, dist, self.plugins, self.device, channels_last)
        self.steps_per_epoch = self.loaders.batches_per_epoch // cfg.accumulation_steps
        self.global_batch = global_batch(cfg.batch_size, dist.size, cfg.accumulation_steps)
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"accumulation_steps={cfg.accumulation_steps}: more than the "
                f"{self.loaders.batches_per_epoch} batches per epoch; lower it"
            )
        self.position = RunPosition(epoch_world=dist.size)
        # A language model's outputs are its data's vocabulary.
        outputs = self.loaders.vocab_size or cfg.num_classes
        self.model = build_run_model(cfg, dist, self.plugins, self.device, channels_last, outputs)
        self.throughput = throughput_unit(cfg, self.device, outputs)
        probe, self.noise_scale = noise_probe(cfg, dist, self.device)
        self.parts = self._build_parts(probe, amp_dtype)
        self.checkpointer = build_checkpointer(
            cfg, dist, self.model, self.parts.optimizer, self.state_dict, self.device
        )
        self.writer: MetricsWriter | None = None
        # The last evaluation: (step, trainer.training.steps.evaluate's figures).
        self.last_eval: tuple[int, dict[str, float]] | None = None

    # ------------------------------------------------------------------ set-up
    def _build_parts(self, probe: GradientProbe | None, amp_dtype: torch.dtype | None) -> StepParts:
        """The wrapped model, optimizer, LR schedule and scaler one step uses."""
        cfg, dist, model = self.cfg, self.dist, self.model
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
        return StepParts(
            model=train_model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            objective=self.plugins.objective(cfg),
            dist=dist,
            device=self.device,
            amp_dtype=amp_dtype,
            accumulation_steps=cfg.accumulation_steps,
            clip_norm=cfg.grad_clip_norm,
            probe=probe,
        )

    # ------------------------------------------------------------------ run state
    def state_dict(self) -> dict[str, Any]:
        """The trainer's entries of a checkpoint (besides the model's and optimizer's tensors).
        A collective: every rank's RNG state, in rank order, is gathered."""
        rng = self.dist.allgather_object(rng_state())
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
        """Restore the trainer's entries of a checkpoint on this rank; ``resume`` then rebuilds
        the LR schedule at the position."""
        self.position.load_state_dict(state)
        self.parts.scaler.load_state_dict(state["scaler"])
        if int(state["world_size"]) == self.dist.size:
            set_rng_state(state["rng"][self.dist.rank])
        # Otherwise the RNG streams start afresh on the new ranks: data order and augmentations
        # depend on (seed, epoch, index) only, not on them.

    # ------------------------------------------------------------------ resume
    def resume(self) -> None:
        """The newest valid checkpoint, if any, restored on every rank (a collective): the
        model and optimizer by the checkpointer, the trainer's entries here; then the epoch,
        the plan and the LR schedule are placed at the position for this world size."""
        found = self.checkpointer.load()
        if found is None:
            if self.cfg.init_from:
                start_from_weights(self.cfg, self.dist, self.model)
            return
        path, state = found
        if self.cfg.init_from and self.dist.is_root:
            print(
                f"init_from={self.cfg.init_from} not applied: the run resumes from its own "
                f"checkpoint {path}",
                flush=True,
            )
        self.load_state_dict(state)
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
        saved_world = int(state["world_size"])
        if saved_world != self.dist.size and self.dist.is_root:
            self._log_resize(saved_world, steps_left)
        if self.dist.is_root:
            print(f"resumed from {path} at step {pos.step} (epoch {pos.epoch})", flush=True)

    def _log_resize(self, saved_world: int, steps_left: int) -> None:
        """Rank 0, resuming on another number of workers: how the epoch continues."""
        pos, sampler = self.position, self.loaders.train.sampler
        dropped = sampler.order_length - pos.epoch_offset - steps_left * self.global_batch
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
            self.global_batch,
            max(0, dropped),
            self.steps_per_epoch,
            self.schedule.peak_lr,
            self.cfg.lr_scaling,
            spread,
        )

    def _plan(self) -> tuple[int, LRSchedule]:
        """The step this run ends at and the LR schedule, from the position and world size."""
        cfg, pos = self.cfg, self.position
        left = max(0, (cfg.epochs - pos.epoch) * self.steps_per_epoch - pos.step_in_epoch)
        total = pos.step + left
        if cfg.max_steps is not None:
            total = min(total, cfg.max_steps)
        end = pos.schedule_step(self.steps_per_epoch) + total - pos.step
        return total, build_schedule(cfg, self.steps_per_epoch, end, self.lr_scale)

    def _training_due(self) -> bool:
        """Steps are left, or after a resize the rest of an epoch is less than one global
        batch: no steps are left in it, but its evaluation and the epoch count still are."""
        pos = self.position
        return pos.step < self.total_steps or (
            pos.epoch < self.cfg.epochs and pos.step_in_epoch >= self.steps_per_epoch
        )

    # ------------------------------------------------------------------ checkpoints and logs
    def save_checkpoint(
        self, moment: Moment, *, ends_epoch: bool = False, stops: bool = False
    ) -> None:
        """A collective: the run is at ``moment`` of this step; the checkpointer writes its
        checkpoint when one is due (``trainer.checkpoints.cadence``); the stall it cost is
        logged."""
        step = self.position.step
        stall = self.checkpointer.save(step, moment, ends_epoch=ends_epoch, stops=stops)
        if stall is not None:
            self.log({"kind": "checkpoint", "step": step, "stall_sec": stall})
        if stall is not None or moment is Moment.STOP:
            # A save, or the stop's wait for one, is a phase of its own (trainer.watch.watchdog).
            self.watchdog.beat()

    def _measure_noise_scale(self, step: int) -> float | None:
        """After a measuring step: the workers' mean squared local gradient norm (a collective)
        and the reduced one into the estimate; logged; B_simple once it is defined."""
        probe, estimate = self.parts.probe, self.noise_scale
        assert probe is not None and estimate is not None
        local_sq = self.dist.allreduce_sum(probe.local_sq).item() / self.dist.size
        record = estimate.update(local_sq, probe.reduced_sq.item())
        self.log({"kind": "noise", "step": step, "global_batch": self.global_batch, **record})
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
        if self.tracking is not None:
            self.tracking.metrics(record)

    # ------------------------------------------------------------------ training
    def train(self) -> RunResult:
        """Epochs of steps, each epoch ending with its evaluation and checkpoint, until the
        plan's end, --run-steps or a stop request; then the run's last checkpoint."""
        pos, loop = self.position, self._begin()
        try:
            while self._training_due() and loop.stopped_by is None:
                self.loaders.train.sampler.set_epoch(
                    pos.epoch, offset=pos.epoch_offset, layout_replicas=pos.epoch_world
                )
                if pos.step_in_epoch < self.steps_per_epoch:
                    batches = self.watch.batches(self.loaders.train)
                    train_one_epoch(self.parts, batches, loop.meter, lambda: self._after_step(loop))
                if pos.step_in_epoch >= self.steps_per_epoch:
                    self._end_epoch()
            loop.stop_vote.close()  # the vote the last step started, which no step reads
            self.save_checkpoint(Moment.STOP)
        except BaseException as err:
            # Another worker died (its watchdog fired, or it crashed): this rank's record of
            # its collectives is half of what says who waited for whom, and a rank that was
            # nearly due itself names itself stuck too (StepWatchdog.peer_failed).
            if is_peer_failure(err):
                # A diagnosis must never replace the error it explains (a full disk here).
                with contextlib.suppress(OSError):
                    self.watchdog.peer_failed()
            raise
        finally:
            self._end(loop)
        return self._result(loop)

    def _begin(self) -> _Loop:
        """The loop's metrics file, progress line, meter, profiler and stop vote."""
        cfg, dist, pos = self.cfg, self.dist, self.position
        if dist.is_root:
            self.writer = MetricsWriter(self.output_dir)
        # --straggler-every, --gpu-telemetry-seconds: the ranks' times and GPU samples.
        self.watch = RankWatch(cfg, dist, self.device, self.writer)
        # --step-timeout-minutes: from here until the loop ends, every step, evaluation and
        # save must end within the limit.
        self.watchdog = StepWatchdog(
            cfg.step_timeout_minutes,
            rank=dist.rank,
            host=socket.gethostname(),
            backend=cfg.backend,
            folder=self.output_dir / "watchdog",
        ).start()
        progress = (
            Progress(pos.step, self.total_steps, unit=self.throughput.unit)
            if dist.is_root
            else None
        )
        meter = WindowMeter(
            self.device, self.throughput.unit, self.parts.objective.correct is not None
        )
        stopped_by = None if self._training_due() else "already_complete"
        started = time.monotonic()
        every = cfg.noise_scale_every
        self.parts.measure = bool(every) and (pos.step + 1) % every == 0
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
        return _Loop(
            start_step=pos.step,
            meter=meter,
            progress=progress,
            profiler=profiler,
            stop_vote=StopVote(dist, self.stop),
            started=started,
            stopped_by=stopped_by,
        )

    def _after_step(self, loop: _Loop) -> bool:
        """After each optimizer step: count it, report it, its checkpoint if one is due, and
        whether training goes on (not once a reason to stop holds)."""
        cfg, pos = self.cfg, self.position
        every = cfg.noise_scale_every
        if self.parts.measure:
            measured = self._measure_noise_scale(pos.step + 1)
            loop.noise_scale = measured or loop.noise_scale
        self.parts.measure = bool(every) and (pos.step + 2) % every == 0
        pos.step += 1
        pos.step_in_epoch += 1
        pos.epoch_offset += self.global_batch
        self.watch.step_done(pos.step)  # every --straggler-every steps, a collective
        self.watchdog.beat(pos.step)
        loop.run_samples += self.throughput.samples_per_batch * cfg.accumulation_steps
        final = self._stop_reason(loop)
        self._report_step(loop, final)
        ends_epoch = pos.step_in_epoch >= self.steps_per_epoch
        self.save_checkpoint(Moment.STEP, ends_epoch=ends_epoch, stops=final is not None)
        if final:
            loop.stopped_by = final
            return False
        return True

    def _stop_reason(self, loop: _Loop) -> str | None:
        """Why training stops after this step, or None. Every rank votes at every step."""
        cfg, pos = self.cfg, self.position
        signalled = loop.stop_vote.next()
        reasons = [
            ("signal", signalled),
            ("max_steps", pos.step >= self.total_steps and cfg.max_steps == self.total_steps),
            ("epochs", pos.step >= self.total_steps),
            (
                "run_steps",
                cfg.run_steps is not None and pos.step - loop.start_step >= cfg.run_steps,
            ),
        ]
        return next((name for name, hit in reasons if hit), None)

    def _report_step(self, loop: _Loop, final: str | None) -> None:
        """Every --log-every steps, at an epoch's end and at the last step: the window's
        figures, reduced over the ranks (a collective), logged; the progress line."""
        cfg, pos = self.cfg, self.position
        record = None
        if pos.step % cfg.log_every == 0 or final or pos.step_in_epoch == self.steps_per_epoch:
            loop.last = loop.meter.reduce(self.dist)
            if cfg.on_bad_image == "skip":
                loop.last["skipped_images"] = self._skipped_images()
            if self.throughput.flops_per_token:
                loop.last.update(
                    throughput_metrics(
                        loop.last["tokens_per_sec"],
                        self.throughput.flops_per_token,
                        self.throughput.peak_tflops,
                    )
                )
            record = {
                "kind": "train",
                "step": pos.step,
                "epoch": pos.epoch,
                "lr": self.parts.optimizer.param_groups[0]["lr"],
                **loop.last,
            }
            self.log(record)
        if loop.progress is not None:
            loop.progress.update(pos.step, record)

    def _end_epoch(self) -> None:
        """The epoch's evaluation (with validation data), then the next epoch's checkpoint."""
        pos = self.position
        if self.loaders.val is not None:
            self.loaders.val.set_epoch(pos.epoch)
            self.last_eval = (pos.step, evaluate(self.parts, self.loaders.val))
            self.log({"kind": "eval", "step": pos.step, "epoch": pos.epoch, **self.last_eval[1]})
            self.watchdog.beat()
        pos.epoch += 1
        pos.step_in_epoch = pos.epoch_offset = 0
        pos.epoch_world = self.dist.size
        self.save_checkpoint(Moment.EPOCH_END)

    def _end(self, loop: _Loop) -> None:
        """After the loop, or an error: the profiler's trace, the checkpoint write in flight
        (it finishes; nothing waits for the other ranks any more), the progress line and the
        metrics file are closed."""
        loop.profiler.close()
        self.watchdog.close()
        self.watch.close()
        self.checkpointer.close()
        if loop.progress is not None:
            loop.progress.close()
        if self.writer is not None:
            self.writer.close()

    def _result(self, loop: _Loop) -> RunResult:
        """The run's figures; the throughput over every rank (a collective)."""
        elapsed = max(time.monotonic() - loop.started, 1e-9)
        rate = torch.tensor([loop.run_samples / elapsed], dtype=torch.float64, device=self.device)
        total_rate = float(self.dist.allreduce_sum(rate).item())
        return RunResult(
            step=self.position.step,
            epoch=self.position.epoch,
            start_step=loop.start_step,
            stopped_by=loop.stopped_by or "epochs",
            last_metrics=loop.last,
            samples_per_sec=total_rate / self.dist.size,
            samples_per_sec_total=total_rate,
            unit=self.throughput.unit,
            global_batch=self.global_batch,
            noise_scale=loop.noise_scale,
            skipped_images=self._skipped_images(),
            stragglers=self.watch.summary(),
            model=self.model,
        )

    def final_evaluation(self) -> dict[str, float] | None:
        """The evaluation of the final weights: the epoch end's when the run ended there, else
        one more pass over the validation data (a collective); None without validation data."""
        if self.loaders.val is None:
            return None
        if self.last_eval is not None and self.last_eval[0] == self.position.step:
            return self.last_eval[1]
        self.loaders.val.set_epoch(self.position.epoch)
        return evaluate(self.parts, self.loaders.val)


def train(
    cfg: TrainConfig,
    dist: Dist,
    stop: StopRequest | None = None,
    plugins: Plugins | None = None,
) -> RunResult:
    """Train as configured on this rank; resumes from ``<output_dir>/checkpoints`` if present,
    else starts from ``--init-from`` if given. ``plugins``: the team's checked plug-ins
    (``trainer.training.plugins.load``)."""
    # MLFLOW_TRACKING_URI: rank 0's run in MLflow, found or made before anything trains.
    with tracked(
        cfg.output_dir, cfg.to_dict(), dist.is_root, cfg.checkpoint_mirror_url
    ) as tracking:
        run = _Run(cfg, dist, stop or StopRequest(), plugins, tracking)
        try:
            run.resume()
            result = run.train()
            result.results = write_results(
                result,
                cfg=cfg,
                dist=dist,
                folder=run.output_dir / results.RESULTS_DIR,
                final_evaluation=run.final_evaluation,
            )
            if tracking is not None:
                # A rerun of a run that had ended logged its results then.
                tracking.finish(
                    result.results,
                    result.stopped_by,
                    result.step,
                    logged_before=result.stopped_by == "already_complete",
                )
        finally:
            # Every engine's loader workers stop here, with the run: FSDP's ranks end without
            # the interpreter's teardown (``Dist.teardown_safe``), whose atexit hook torch stops
            # them with, and a worker and its forkserver keep each other alive once this
            # process is gone.
            run.loaders.stop_workers()
    return result
