"""Two real DDP workers on 127.0.0.1, one blocked inside a collective (tests/trainer/
stuck_rank.py): the step watchdog (trainer/watch/watchdog.py) fires on its limit, names the stuck
ranks in one line each, writes stacks that name the blocking frame and the flight recorder's
collectives, exits 86; the retry resumes from the last checkpoint and finishes. Both ranks'
watchdogs come due together: the one that would fire second may find its collective already
failed by the other's exit, and then, nearly due, fires there (StepWatchdog.peer_failed)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.launchers import REPO, read_metrics, small_config, torchrun
from trainer.common.exit_codes import WATCHDOG_EXIT
from trainer.settings.flags import to_flags

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

STUCK_STEP = 3  # rank 1 blocks in its third step, after the step-2 checkpoint


def test_a_rank_blocked_in_a_collective_is_named_and_the_retry_resumes(tmp_path):
    out = tmp_path / "out"
    config = small_config(
        out,
        backend="ddp",
        model="tests.trainer.watch.stuck_rank:build",
        checkpoint_every=2,
        log_every=1,
        loader_workers=0,
        # 9 s: far above a step of this model (under 0.1 s), so only the blocked step trips it.
        step_timeout_minutes=0.15,
    )
    env = {
        **os.environ,
        "STUCK_RANK": "1",
        "STUCK_STEP": str(STUCK_STEP),
        "STUCK_MARKER": str(tmp_path / "blocked"),
    }
    command = torchrun("-m", "trainer", *to_flags(config))
    first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    output = first.stdout + first.stderr
    assert first.returncode != 0, output[-3000:]
    assert (tmp_path / "blocked").exists()
    lines = [line for line in output.splitlines() if "error: watchdog: " in line]
    assert any("rank 1 on host " in line for line in lines), output[-3000:]
    for line in lines:
        assert "is stuck: no step completed for " in line
        assert "(limit 9 s, --step-timeout-minutes) after step 2" in line
        assert f"exiting with {WATCHDOG_EXIT}" in line
        assert "flight recorder: group 0: #" in line
    assert f"exitcode  : {WATCHDOG_EXIT}" in output  # torchrun's failure summary

    stacks = list((out / "watchdog").glob("rank-1-*.stacks.txt"))
    assert len(stacks) == 1
    text = stacks[0].read_text()
    readable = text.split("faulthandler (every thread")[0]
    main = readable.split("thread MainThread")[1].split("\nthread ")[0]
    # The innermost frames of the training thread: the hook and the collective it waits in.
    assert "stuck_rank.py" in main and "in maybe_block_in_a_collective" in main
    assert "td.recv(" in main
    # The flight recorder (Gloo's here) records no point-to-point recv, but it shows who never
    # reached the collective the other waits in: rank 0 enqueued one more than rank 1.
    enqueued = {}
    for rank in (0, 1):
        (dump,) = (out / "watchdog").glob(f"rank-{rank}-*.collectives.json")
        status = json.loads(dump.read_text())["pg_status"]["0"]
        enqueued[rank] = int(status["last_enqueued_collective"])
    assert enqueued[0] == enqueued[1] + 1

    retry = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    output = retry.stdout + retry.stderr
    assert retry.returncode == 0, output[-3000:]
    assert "at step 2 (epoch 0)" in output and "resumed from " in output
    steps = [r["step"] for r in read_metrics(out) if r.get("kind") == "train"]
    assert steps[-1] == 2 * (128 // 2 // 8)  # every step of both epochs
    assert "error: watchdog" not in output
