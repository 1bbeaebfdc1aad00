"""The tools that look into a run: a profiler trace, a debugger, the preflight's bandwidth floor
(``DiagnosisSettings``), and the watch over the ranks: stragglers, GPU telemetry and the step
watchdog (``WatchSettings``); each field checked here."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.common.errors import ConfigError
from trainer.common.values import shown
from trainer.settings.checks import check_float_range, check_int_range, profile_window
from trainer.settings.declare import setting


@dataclass(frozen=True)
class DiagnosisSettings:
    """Asked for when something is wrong: a trace (trainer.watch.profiling), a debugger
    (trainer.watch.debugger), a bandwidth floor before training."""

    profile_steps: str = setting(
        "",
        "record a torch.profiler trace of optimizer steps A-B (for example 20-25) on "
        "every rank, into tensorboard/profile/rank<N>_<host>.<time>.pt.trace.json (open it in "
        "Perfetto UI or chrome://tracing); empty: off",
    )
    debug_rank: int | None = setting(
        None,
        "this rank waits for a debugger (debugpy, Debug Adapter Protocol) on "
        "--debug-port before training; every other rank waits at a barrier until it attaches",
    )
    debug_port: int = setting(
        5678, "TCP port the --debug-rank rank listens on, on every interface (1024-65535)"
    )
    preflight_min_busbw: float = setting(
        0.0,
        "before training, stop if allreduce bus bandwidth (GB/s) is lower; "
        "0 skips (a Batch job sets it from its VM size, trainer/launch/node_sizes.py)",
    )

    def check_diagnosis(self) -> None:
        if self.profile_steps:
            profile_window(self.profile_steps)
        if self.debug_rank is not None:
            # The upper bound is the world size, known once the workers start
            # (trainer.watch.debugger).
            check_int_range("debug_rank", self.debug_rank, 0, 1_000_000)
        check_int_range("debug_port", self.debug_port, 1024, 65535)
        check_float_range("preflight_min_busbw", self.preflight_min_busbw, 0.0, 100_000.0)


@dataclass(frozen=True)
class WatchSettings:
    """Always on: the ranks compared (trainer.watch.rank_watch) and the step watchdog
    (trainer.watch.watchdog)."""

    # A rank is named when its data wait or own work exceeds the others' median by more than
    # straggler_margin of their median step (0.5: half a step lost per step).
    straggler_every: int = setting(
        50,
        "every N steps the ranks share their step and data-wait times and GPU "
        "samples (one allreduce); a slow rank is logged as a kind: straggler record; 0: never",
    )
    straggler_margin: float = setting(
        0.5,
        "name a rank whose data wait or own work per step exceeds the other "
        "ranks' median by more than this fraction of their median step",
    )
    # CPUs: never sampled.
    gpu_telemetry_seconds: float = setting(
        10.0,
        "each rank samples its GPU (NVML: utilisation, memory, "
        "temperature, power, ECC, XID) every N seconds on a thread; kind: gpu records; 0: off",
    )
    step_timeout_minutes: float = setting(
        0.0,
        "a rank that completes no step, evaluation or checkpoint save for N "
        "minutes writes its Python stacks and collectives to <output-dir>/watchdog/ and exits with "
        "86; 0: 20 median steps, at least 10 minutes",
    )

    def check_watch(self) -> None:
        check_int_range("straggler_every", self.straggler_every, 0, 10**9)
        check_float_range("straggler_margin", self.straggler_margin, 0.05, 100.0)
        seconds = self.gpu_telemetry_seconds
        if seconds != 0:
            try:
                check_float_range("gpu_telemetry_seconds", seconds, 0.1, 3600.0)
            except ConfigError:
                raise ConfigError(
                    f"gpu_telemetry_seconds={shown(seconds)}: must be 0 (off) or a number of "
                    "seconds in [0.1, 3600]"
                ) from None
        minutes = self.step_timeout_minutes
        if minutes != 0:
            try:
                check_float_range("step_timeout_minutes", minutes, 0.05, 10080.0)
            except ConfigError:
                raise ConfigError(
                    f"step_timeout_minutes={shown(minutes)}: must be 0 (derived from the median "
                    "step, at least 10 minutes) or a number of minutes in [0.05, 10080]"
                ) from None
