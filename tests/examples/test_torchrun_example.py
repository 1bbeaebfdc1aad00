"""examples/torchrun_ddp/train.py run exactly as docs/jobs.md says (torchrun, two CPU workers):
it trains, checkpoints to $DT_RUN_DIR/checkpoints, writes TensorBoard and metrics.jsonl there,
resumes from its newest checkpoint, and stops every rank at one step on a SIGTERM."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.support.launchers import BIN, REPO
from tests.support.process_tree import RUN_TAG, check_none_left, new_tag
from trainer.checkpoints import single_file

# The documented command (docs/jobs.md, Your own script), as a user types it.
DOCUMENTED = "torchrun --standalone --nproc_per_node 2 examples/torchrun_ddp/train.py"

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


def _start(run_dir: Path, *flags: str) -> subprocess.Popen:
    argv = shlex.split(DOCUMENTED) + list(flags)
    env = {**os.environ, "DT_RUN_DIR": str(run_dir), "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _run(run_dir: Path, *flags: str) -> str:
    process = _start(run_dir, *flags)
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out
    return out


def _steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> dict:
    """The documented command's first run in a fresh run folder, 6 steps with a checkpoint
    every 3: its output and its folder, left as the run left it. Read by
    ``test_the_documented_command_trains_and_checkpoints`` (what the run wrote) and copied by
    ``test_a_rerun_resumes_and_a_sigterm_to_one_worker_stops_every_rank_at_one_step``, whose
    signalled run is the rerun (a retried task) that resumes from it."""
    run_dir = tmp_path_factory.mktemp("first") / "run"
    # Tagged as a test's own runs are (no_leftover_processes): none of its processes may
    # outlive it, whichever test builds it.
    with pytest.MonkeyPatch.context() as env:
        tag = new_tag()
        env.setenv(RUN_TAG, tag)
        out = _run(run_dir, "--steps", "6", "--checkpoint-every", "3")
        check_none_left(tag)
    return {"out": out, "run_dir": run_dir}


def test_the_documented_command_trains_and_checkpoints(first_run):
    out, run_dir = first_run["out"], first_run["run_dir"]
    assert "training steps 1..6 on 2 workers" in out and "done at step 6" in out
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step-00000003.pt", "step-00000006.pt"]
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert _steps(run_dir) == [1, 2, 3, 4, 5, 6]


def test_a_rerun_resumes_and_a_sigterm_to_one_worker_stops_every_rank_at_one_step(
    first_run, tmp_path
):
    """A second run in the first run's folder (a retried task) continues from the newest of its
    checkpoints; signalled, it stops every rank at one step with a checkpoint, which the next
    run continues from. (One run is both the rerun and the signalled one: each run is a whole
    torchrun job to start, and the resume needs none of its own.)"""
    run_dir = tmp_path / "run"
    shutil.copytree(first_run["run_dir"], run_dir)
    process = _start(run_dir, "--steps", "100000", "--step-seconds", "0.05")
    try:
        while _steps(run_dir)[-1] < 6 + 3:  # 3 steps of its own, after the first run's 6
            assert process.poll() is None, process.stdout.read()
            time.sleep(0.1)
        workers = [
            child
            for child in psutil.Process(process.pid).children(recursive=True)
            if "train.py" in " ".join(child.cmdline()) and child.pid != process.pid
        ]
        assert len(workers) == 2, workers
        # The launcher signals every worker; one of them getting it first must be enough.
        workers[-1].send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, out
    # It resumed from step 6, the newer of the first run's two checkpoints.
    assert "training steps 7..100000 on 2 workers" in out
    stopped = _steps(run_dir)[-1]
    assert f"stopped by a signal at step {stopped}: checkpointed" in out
    assert (run_dir / "checkpoints" / f"step-{stopped:08d}.pt").is_file()
    out = _run(run_dir, "--steps", str(stopped + 1))
    assert f"training steps {stopped + 1}..{stopped + 1}" in out
    # Each run appended its own steps to the folder's records, none twice.
    assert _steps(run_dir) == list(range(1, stopped + 2))


def test_a_run_folder_holding_the_trainers_checkpoint_is_refused_in_one_line(tmp_path):
    """docs/jobs.md's laptop command once used `make demo`'s run folder: the example then loaded
    the demo's ResNet checkpoint into its own model and every rank died in load_state_dict."""
    run_dir = tmp_path / "run"
    trainers = single_file.save(
        run_dir / "checkpoints", 40, {"model": {"fc.weight": torch.zeros(10, 512)}}, keep=2
    )
    before = trainers.read_bytes()
    process = _start(run_dir, "--steps", "4")
    out, _ = process.communicate(timeout=300)
    assert process.returncode != 0, out
    said = [line for line in out.splitlines() if "is not a checkpoint of" in line]
    assert said == [
        f"{trainers} is not a checkpoint of examples/torchrun_ddp (the trainer's, or another "
        "script's): set DT_RUN_DIR to a run folder of this script's own"
    ], out
    assert "load_state_dict" not in out and 'train.py", line' not in out, out
    assert "exitcode  : 2" in out  # torchrun's own summary of each worker's exit
    assert not (run_dir / "metrics.jsonl").exists()  # no rank trained
    assert trainers.read_bytes() == before


def test_the_documented_laptop_command_uses_a_run_folder_of_its_own():
    guide = (REPO / "docs" / "jobs.md").read_text()
    line = next(line for line in guide.splitlines() if DOCUMENTED in line)
    assert line.startswith("DT_RUN_DIR=runs/torchrun_ddp "), line
