"""--step-timeout-minutes: a thread per rank that notices when training stops making progress.

The loop calls ``beat`` after every step, evaluation and checkpoint save (each phase restarts
the clock, so the limit must cover the longest of them, not their sum). When nothing beats for
the limit the rank writes its Python stacks and the engine's view of its collectives to
``<output_dir>/watchdog/``, prints one line naming itself and its host, and exits with
``WATCHDOG_EXIT``: the launcher ends the try and the retry resumes from the last checkpoint,
instead of the engine's own timeout (30 min in torch.distributed, none in Horovod) or the job's
wall-clock limit deciding. A rank blocked in a collective cannot tell which peer is missing: the
ranks whose watchdog did NOT fire (a process wedged below Python) and, in the flight recorder,
the rank with the fewest collectives enqueued are the suspects.
"""

from __future__ import annotations

import faulthandler
import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path

from trainer.common.exit_codes import WATCHDOG_EXIT

# With --step-timeout-minutes 0 the limit is STEP_MULTIPLE median steps, never under the floor:
# a stuck collective costs at most this much of the job, and evaluations and checkpoint saves
# (watched too, each as one phase) rarely take longer; a slower one needs an explicit limit.
FLOOR_SECONDS = 600.0
STEP_MULTIPLE = 20
# The step times the median is taken over: the recent ones, so a slower phase of the run counts.
WINDOW = 200
# The torch.distributed flight recorder's ring buffer (entries per process group): enabled for
# every torch engine before its group starts, which reads it then. torch 2.13 reads
# TORCH_FR_BUFFER_SIZE (TORCH_NCCL_TRACE_BUFFER_SIZE before it) for NCCL and Gloo alike; the
# PyTorch tutorial "Flight Recorder for Debugging Stuck Jobs" (prototype, 2.5+) describes it.
FLIGHT_RECORDER_ENTRIES = "2000"
# A rank blocked in a collective and its peers waiting in it come due together: the first to
# fire exits, which breaks the others' collective at once, often before their own watchdog
# looked (on a busy node, by a poll or more). A rank that meets that failure when it has made no
# progress for this share of its limit is as stuck as the peer, and fires too.
NEAR_DUE = 0.8
# Past this share of its limit without progress, the watchdog thread keeps the stacks as they
# are (the training thread still blocked where it waits): a rank that fires later on a peer's
# failure writes those, since by then its collective has failed and its own stack moved on.
SNAPSHOT_SHARE = 0.5
TORCH_ENGINES = ("ddp", "fsdp")


def enable_flight_recorder(backend: str, env: dict[str, str] | os._Environ[str]) -> None:
    """Before the process group starts: let torch.distributed record its collectives (an
    operator's own setting wins)."""
    if backend in TORCH_ENGINES and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        env.setdefault("TORCH_FR_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES)


def limit_seconds(minutes: float, step_times: list[float]) -> float:
    """The limit: ``minutes`` when set, else STEP_MULTIPLE median steps with the floor."""
    if minutes:
        return minutes * 60.0
    if not step_times:
        return FLOOR_SECONDS
    return max(FLOOR_SECONDS, STEP_MULTIPLE * statistics.median(step_times))


def engine_view(backend: str) -> tuple[str, str] | None:
    """(what it is, its text): the engine's own record of this rank's collectives, or None.

    torch engines: the flight recorder's JSON dump (``_dump_fr_trace_json``, every entry with
    its state and each group's last enqueued/started/completed sequence number). Horovod keeps
    no such record a worker can read: its stall inspector on the coordinator (rank 0) logs the
    ranks missing from a collective after HOROVOD_STALL_CHECK_TIME_SECONDS (60 s by default,
    horovod/common/stall_inspector.cc), which the run's log already holds."""
    if backend not in TORCH_ENGINES:
        return None
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        return "flight recorder", _dump_fr_trace_json(onlyActive=False).decode()
    except Exception as err:  # a diagnosis must never hide the stacks
        return "flight recorder", json.dumps({"error": f"{type(err).__name__}: {err}"})


def collectives_summary(view: str) -> str:
    """The flight recorder's last enqueued and completed collective, per process group."""
    try:
        status = json.loads(view).get("pg_status", {})
    except ValueError:
        return "unreadable"
    parts = [
        f"group {pg}: #{s.get('last_enqueued_collective')} enqueued, "
        f"#{s.get('last_completed_collective')} completed"
        for pg, s in sorted(status.items())
    ]
    return "; ".join(parts) or "none recorded"


def format_stacks() -> str:
    """Every thread's Python stack, named, innermost call last."""
    names = {t.ident: t for t in threading.enumerate()}
    blocks = []
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        title = f"thread {thread.name if thread else '?'} ({ident})"
        blocks.append(title + "\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(blocks)


class StepWatchdog:
    """One rank's watchdog thread; ``beat`` restarts its clock, ``check`` is one look at it."""

    def __init__(
        self,
        minutes: float,
        *,
        rank: int,
        host: str,
        backend: str,
        folder: Path,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self.minutes, self.rank, self.host, self.backend = minutes, rank, host, backend
        self.folder, self._clock, self._exit = folder, clock, exit
        self._steps: deque[float] = deque(maxlen=WINDOW)
        self._lock = threading.Lock()
        self._last = clock()
        self._last_step: float | None = None
        self.step = 0
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        # The stacks the watchdog thread kept in this stretch without progress, with its idle
        # time then (SNAPSHOT_SHARE); None since the last beat.
        self._kept_stacks: tuple[str, float] | None = None

    def start(self) -> StepWatchdog:
        self._thread = threading.Thread(target=self._watch, name="step-watchdog", daemon=True)
        self._thread.start()
        return self

    def beat(self, step: int | None = None) -> None:
        """A step (``step``: the run's step count after it), an evaluation or a save ended."""
        now = self._clock()
        with self._lock:
            if step is not None:
                if self._last_step is not None and self._last_step == self._last:
                    self._steps.append(now - self._last)  # only step after step: a median step
                self._last_step, self.step = now, step
            self._last = now
            self._kept_stacks = None

    def limit(self) -> float:
        with self._lock:
            return limit_seconds(self.minutes, list(self._steps))

    def check(self, share: float = 1.0, kept: bool = False) -> bool:
        """Fire when nothing beat for ``share`` of the limit; True when it fired. ``kept``: with
        the stacks the watchdog thread kept in this stretch, when it kept some."""
        with self._lock:
            idle = self._clock() - self._last
            stacks = self._kept_stacks if kept else None
        limit = self.limit()
        if idle < share * limit or self._closed.is_set():
            return False
        self._fire(idle, limit, stacks)
        return True

    def keep_stacks(self) -> None:
        """Past ``SNAPSHOT_SHARE`` of the limit without progress, keep the stacks once."""
        with self._lock:
            idle, kept = self._clock() - self._last, self._kept_stacks
        if kept is None and idle >= SNAPSHOT_SHARE * self.limit():
            stacks = format_stacks()
            with self._lock:
                if self._clock() - self._last >= idle:  # no beat meanwhile
                    self._kept_stacks = (stacks, idle)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        while not self._closed.wait(min(5.0, max(0.2, self.limit() / 20))):
            if self.check():
                return
            self.keep_stacks()

    def peer_failed(self) -> None:
        """Another worker stopped and broke this rank's collective: this rank fires as well when
        it was nearly due (``NEAR_DUE``), else it keeps its record of the collectives."""
        if not self.check(NEAR_DUE, kept=True):
            self.keep_engine_view()

    def keep_engine_view(self) -> str | None:
        """Write the engine's record of this rank's collectives where a firing writes it, and
        say what it holds and where (None: the engine keeps no such record). Also for a rank
        that stops because another worker did: whichever rank's watchdog (or crash) ended the
        run first, each rank's record is there to compare."""
        view = engine_view(self.backend)
        if view is None:
            return None
        kind, text = view
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self._stem}.collectives.json"
        path.write_text(text, encoding="utf-8")
        return f"{kind}: {collectives_summary(text)}, in {path}"

    @property
    def _stem(self) -> str:
        return f"rank-{self.rank}-{self.host}"  # a host name may hold dots: no with_suffix

    def _fire(self, idle: float, limit: float, kept: tuple[str, float] | None = None) -> None:
        """The stacks (``kept``: as the watchdog thread kept them, idle that long), the
        engine's view and one line; then the worker exits."""
        self.folder.mkdir(parents=True, exist_ok=True)
        stacks = self.folder / f"{self._stem}.stacks.txt"
        seen = format_stacks() if kept is None else kept[0]
        when = (
            ""
            if kept is None
            else (
                f"; the stacks as the watchdog saw them {kept[1]:.1f} s in, before a peer's "
                "failure broke the collective this rank waited in"
            )
        )
        with open(stacks, "w", encoding="utf-8") as out:
            out.write(
                f"rank {self.rank} on {self.host}: no step completed for {idle:.1f} s "
                f"(limit {limit:.1f} s) after step {self.step}{when}\n\n{seen}\n"
                "faulthandler (every thread, also those Python shows no frame for):\n"
            )
            out.flush()
            faulthandler.dump_traceback(out, all_threads=True)
        where = f"stacks in {stacks}"
        kept = self.keep_engine_view()
        if kept is not None:
            where += f"; {kept}"
        elif self.backend == "horovod":
            where += "; collectives: Horovod's stall inspector lines in rank 0's log"
        print(
            f"error: watchdog: rank {self.rank} on host {self.host} is stuck: no step completed "
            f"for {idle:.0f} s (limit {limit:.0f} s, --step-timeout-minutes) after step "
            f"{self.step}; {where}; exiting with {WATCHDOG_EXIT} so the retry resumes from "
            "the last checkpoint",
            file=sys.stderr,
            flush=True,
        )
        self._exit(WATCHDOG_EXIT)
