"""Workers killed or stopped in a 2-worker Horovod run on 127.0.0.1: nothing hangs, the rerun
resumes from the last checkpoint and ends with the weights of an uninterrupted run."""

import json
import signal
import subprocess
import time

import psutil
import pytest
import torch

from tests.support.launchers import (
    SIGNAL_RUN,
    SIGNAL_RUN_STEPS,
    horovodrun,
    read_metrics,
    signal_run,
    small_config,
    torchrun,
)
from tests.trainer.engines.test_two_workers import run, worker_processes
from trainer.checkpoints import single_file

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

COMMON = {**SIGNAL_RUN, "checkpoint_every": 4}
TOTAL = SIGNAL_RUN_STEPS


def _start(config, tmp_path, repo, name, launch=horovodrun):
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "w") as log_file:  # a file: an unread pipe would block the workers
        launcher = subprocess.Popen(
            launch(*signal_run(config)), cwd=repo, stdout=log_file, stderr=subprocess.STDOUT
        )
    return launcher, log_path


def _wait_for_step(launcher, log_path, output, step):
    deadline = time.monotonic() + 120
    while not any(r["step"] >= step for r in read_metrics(output)):
        assert launcher.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"the run never reached step {step}"
        time.sleep(0.05)


def test_sigkill_of_one_worker_ends_the_run_and_the_rerun_matches(
    tmp_path, repo, uninterrupted_signal_run
):

    config = small_config(tmp_path / "killed", **COMMON)
    launcher, log_path = _start(config, tmp_path, repo, "killed")
    _wait_for_step(launcher, log_path, tmp_path / "killed", 10)
    workers = worker_processes(psutil.Process(launcher.pid))
    assert len(workers) == 2
    last_logged = max(r["step"] for r in read_metrics(tmp_path / "killed"))
    complete = max(
        (step for step, _ in single_file.list_checkpoints(tmp_path / "killed" / "checkpoints")),
        default=0,
    )
    workers[-1].kill()
    launcher.wait(timeout=60)  # no hang: the surviving worker must not wait forever
    assert launcher.returncode != 0
    for worker in workers:
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE

    saved = single_file.list_checkpoints(tmp_path / "killed" / "checkpoints")[0][0]
    # Nothing complete is lost; at most one interval, and the one whose save was still being
    # written in the background when the worker died (a loaded machine saw step 8's in flight).
    assert saved >= complete
    assert last_logged - saved <= 2 * COMMON["checkpoint_every"]
    resumed = run(horovodrun(*signal_run(config)), repo)
    assert f"at step {saved}" in resumed.stdout
    expected = uninterrupted_signal_run
    _, got = single_file.load_latest(tmp_path / "killed" / "checkpoints")
    assert expected["step"] == got["step"] == TOTAL
    for name, tensor in expected["model"].items():
        assert torch.allclose(tensor.double(), got["model"][name].double(), atol=1e-6), name


@pytest.mark.parametrize("backend", ["horovod", "ddp"])
def test_sigterm_to_all_workers_checkpoints_and_exits_0_within_30s(tmp_path, repo, backend):
    """As Batch stops a task: every worker gets SIGTERM (horovodrun's or torchrun's workers);
    the leak check of every test here then finds no process of the run alive."""
    config = small_config(tmp_path / "run", **{**COMMON, "checkpoint_every": 0, "backend": backend})
    launch = torchrun if backend == "ddp" else horovodrun
    launcher, log_path = _start(config, tmp_path, repo, "run", launch=launch)
    _wait_for_step(launcher, log_path, tmp_path / "run", 5)
    for worker in worker_processes(psutil.Process(launcher.pid)):
        worker.send_signal(signal.SIGTERM)
    launcher.wait(timeout=30)
    output = log_path.read_text()
    assert launcher.returncode == 0, output[-3000:]
    assert output.count("stopped by signal") >= 1
    stopped = single_file.list_checkpoints(tmp_path / "run" / "checkpoints")[0][0]
    assert 5 <= stopped < TOTAL  # written at the stop, not at an epoch end


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_workers_whose_launcher_is_killed_stop_instead_of_training_on(tmp_path, repo, backend):
    """torchrun or horovodrun (on Batch: the node launcher) killed with SIGKILL cannot stop its
    workers. Each worker asked the kernel for a SIGTERM when its parent dies: under torchrun
    both stop at the same step, checkpoint it and exit. Under horovodrun the parent is
    Horovod's per-worker middleman, which outlives horovodrun, sends SIGTERM and SIGKILLs after
    5 s (GRACEFUL_TERMINATION_TIME_S in horovod/runner/common/util/safe_shell_exec.py): a
    checkpoint only if the step ends in time. Either way no process of the run outlives it
    (the check of tests/support/process_tree.py covers the middlemen, re-parented when it died)."""
    settings = {**COMMON, "backend": backend, "checkpoint_every": 0}
    if backend == "horovod":  # no checkpoint to compare: the tiny model, which starts fastest
        settings = {"backend": backend, "epochs": 200, "log_every": 1, "checkpoint_every": 0}
    config = small_config(tmp_path / "run", **settings)
    launch = torchrun if backend == "ddp" else horovodrun
    launcher, log_path = _start(config, tmp_path, repo, "run", launch=launch)
    _wait_for_step(launcher, log_path, tmp_path / "run", 3)
    workers = worker_processes(psutil.Process(launcher.pid))
    assert len(workers) == 2
    launcher.kill()
    launcher.wait(timeout=10)
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive, f"workers outlived their launcher: {alive}\n{log_path.read_text()[-3000:]}"
    if backend == "ddp":
        stopped = single_file.list_checkpoints(tmp_path / "run" / "checkpoints")[0][0]
        assert 3 <= stopped < TOTAL
        assert "stopped by signal" in log_path.read_text()


def test_a_ddp_rank_killed_leaves_the_survivor_one_line_not_a_traceback(tmp_path, repo):
    config = small_config(tmp_path / "run", **{**COMMON, "backend": "ddp", "checkpoint_every": 0})
    launcher, log_path = _start(config, tmp_path, repo, "run", launch=torchrun)
    _wait_for_step(launcher, log_path, tmp_path / "run", 3)
    workers = worker_processes(psutil.Process(launcher.pid))
    workers[-1].kill()
    launcher.wait(timeout=60)
    output = log_path.read_text()
    assert launcher.returncode != 0
    assert "another worker stopped (its log says why)" in output
    assert "[rank0]: Traceback" not in output, output[-3000:]
    # The survivor kept its record of the collectives, as a rank whose watchdog fired does.
    (dump,) = (tmp_path / "run" / "watchdog").glob("rank-*.collectives.json")
    assert "pg_status" in json.loads(dump.read_text())
