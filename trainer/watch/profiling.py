"""``--profile-steps A-B``: a torch.profiler trace of optimizer steps A to B on every rank.
Why it is built this way: docs/internals.md, `trainer/watch/profiling.py`."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from trainer.settings.checks import profile_window

log = logging.getLogger(__name__)


def trace_folder(output_dir: Path) -> Path:
    """Where the traces go: a folder in the run's TensorBoard folder (``MetricsWriter``'s)."""
    return output_dir / "tensorboard" / "profile"


def step_schedule(first: int, last: int) -> Callable[[int], ProfilerAction]:
    """What the profiler does during optimizer step ``step``: warm up in the step before
    ``first``, record ``first`` to ``last``, and write the trace when ``last`` ends."""

    def action(step: int) -> ProfilerAction:
        if step == first - 1:
            return ProfilerAction.WARMUP
        if first <= step < last:
            return ProfilerAction.RECORD
        if step == last:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.NONE

    return action


@contextlib.contextmanager
def profiling(
    profile_steps: str,
    output_dir: Path,
    rank: int,
    device: torch.device,
    steps_done: int,
    end_step: int,
) -> Iterator[torch.profiler.profile | None]:
    """The profiler of this invocation, which runs from step ``steps_done`` + 1 to at most
    ``end_step``; None when off or when the window lies outside those steps. Call its ``step()``
    after each optimizer step but the invocation's last; leaving the block writes the trace if
    the run stopped inside the window."""
    if not profile_steps:
        yield None
        return
    first, last = profile_window(profile_steps)
    if first > end_step and rank == 0:
        log.warning(
            "profile_steps=%s: the run ends at step %d; no trace is recorded",
            profile_steps,
            end_step,
        )
    if steps_done >= last or first > end_step:
        yield None
        return
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=step_schedule(first, last),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(
            str(trace_folder(output_dir)), worker_name=f"rank{rank}_{socket.gethostname()}"
        ),
        record_shapes=False,
        with_stack=False,
    )
    # The profiler numbers the time before its first step() 0, and each step() opens the next
    # number. Starting it at the steps done and stepping once names the first step of this
    # invocation by its number in the run (ProfilerStep#N), resumed or not.
    profiler.step_num = steps_done
    with profiler:
        profiler.step()
        yield profiler
