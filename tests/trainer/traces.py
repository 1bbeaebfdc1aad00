"""Reading the trainer's profiler traces (--profile-steps) the way a trace viewer does: the
Chrome trace JSON each rank wrote, its events, and the optimizer steps it marks."""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainer.watch.profiling import trace_folder

_STEP = re.compile(r"ProfilerStep#(\d+)")
# rank<N>_<host>.<time in ns>.pt.trace.json (torch's tensorboard_trace_handler naming).
_FILE = re.compile(r"(rank\d+)_.+\.(\d+)\.pt\.trace\.json")


def traces(output_dir: Path) -> dict[str, list[Path]]:
    """Each rank's trace files by ``rank<N>``, oldest first (none before the first is written);
    any other file fails."""
    folder = trace_folder(output_dir)
    found: dict[str, list[tuple[int, Path]]] = {}
    for path in folder.iterdir() if folder.is_dir() else ():
        match = _FILE.fullmatch(path.name)
        assert match, f"not a trace file name: {path.name}"
        found.setdefault(match[1], []).append((int(match[2]), path))
    return {rank: [path for _, path in sorted(files)] for rank, files in sorted(found.items())}


def steps_recorded(path: Path) -> list[int]:
    """The optimizer steps a trace covers, each a complete event with a duration."""
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    assert all("ph" in event for event in events), "not Chrome trace events"
    assert any(event.get("name", "").startswith("aten::") for event in events), "no operators"
    steps = [
        (int(match[1]), event)
        for event in events
        if (match := _STEP.fullmatch(str(event.get("name", ""))))
    ]
    assert all(event["ph"] == "X" and event["dur"] > 0 for _, event in steps)
    return sorted({step for step, _ in steps})


def recorded_steps(output_dir: Path) -> dict[str, list[list[int]]]:
    """The steps each rank's traces record, by rank, a list per trace (oldest first)."""
    return {
        rank: [steps_recorded(path) for path in paths] for rank, paths in traces(output_dir).items()
    }
