"""A team's own code on emulated Batch nodes (docs/jobs.md, Your own script and Your code without
an image rebuild): the torchrun example as a two-node ``command:`` job whose code is a snapshot
(``jobs.<name>.code``) with a requirements file, and the plug-in example as a trainer job from
a snapshot. The snapshot is made by ``infra.code_snapshot`` and put where ``pulumi up`` puts it;
each node's job preparation fetches it with the node's identity, verifies it and installs the
requirements; the real launcher starts the workers in it. Every container runs in the trainer
image `make image` built (``built_image``): its Python, packages and trainer, not this checkout's
venv, which is what a node runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from infra.code_snapshot import CodeSnapshot, snapshot
from infra.toolchain import BASE_PYTHON as IMAGE_PYTHON
from tests.batch_emulator import REPO
from tests.batch_emulator.cluster import Cluster
from tests.batch_emulator.job_run import JobRun
from tests.batch_emulator.jobs import (
    RUN_SECONDS,
    booted,
    current_attempt,
    describe,
    folder_logs,
    in_built_image,
    make_spec,
    metrics,
    run_folder,
    submit,
    team_repo,
    upload_snapshot,
    wait_for,
    worker_pids,
)

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes


def _upload(vnet, storage, tmp_path: Path, team: str, files: dict[str, Path]) -> CodeSnapshot:
    """The team's repository (``team_repo``), snapshotted and uploaded."""
    snap = snapshot(team, team_repo(tmp_path, team, files))
    upload_snapshot(vnet, storage, tmp_path, snap)
    return snap


def _prepared_on_every_node(cluster: Cluster, run: JobRun, snap: CodeSnapshot) -> None:
    """Each node's preparation downloaded, verified and installed the snapshot, requirements
    included, before the task ran there: by the image's own Python (its pip laid the team's
    packages out for python3.13)."""
    for node in run.nodes:
        said = run.prep_output(node)
        assert f"code {snap.sha256[:12]}: downloaded, verified and installed" in said, said
        (site,) = node.root.rglob(f"{snap.sha256}/site")
        assert (site / "team_dep" / "__init__.py").is_file(), describe(cluster, run)
        assert site.resolve().parent.name == IMAGE_PYTHON, site.resolve()


def _script_checkpoints(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "checkpoints").glob("step-*.pt"))


def test_a_torchrun_script_from_a_snapshot_resumes_after_a_killed_worker_and_honours_sigterm(
    make_cluster, vnet, storage, cpu_stack, tmp_path, built_image
):
    script = REPO / "examples" / "torchrun_ddp" / "train.py"
    snap = _upload(vnet, storage, tmp_path, "team", {"train.py": script})
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill", image_root=built_image)
    command = ("python", "train.py", "--steps", "100000", "--checkpoint-every", "5")
    spec = make_spec(
        cpu_stack, storage, trainer={}, command=command, engine="torch",
        code_sha256=snap.sha256,
    )  # fmt: skip
    run = submit(cluster, spec)
    folder = run_folder(cluster, spec)
    wait_for(lambda: _script_checkpoints(folder), RUN_SECONDS, "a checkpoint", cluster, run)
    _prepared_on_every_node(cluster, run, snap)
    first = current_attempt(folder)
    assert "training steps 1..100000 on 2 workers" in folder_logs(folder, first)

    # A worker on the non-primary node dies: the try fails and Batch retries it, which resumes
    # from the script's own newest checkpoint in $DT_RUN_DIR/checkpoints.
    subtask = next(n for n in run.nodes if n is not run.master)
    workers = worker_pids(cluster, run, subtask.index, script="train.py")
    assert workers and all(in_built_image(pid) for pid in workers), describe(cluster, run)
    os.kill(workers[0], signal.SIGKILL)
    wait_for(lambda: run.tries, 60, "the try's failure", cluster, run)
    assert run.tries[0].exit_code != 0, describe(cluster, run)
    wait_for(lambda: current_attempt(folder) != first, RUN_SECONDS, "the retry", cluster, run)
    retry = current_attempt(folder)
    wait_for(lambda: "training steps" in folder_logs(folder, retry), RUN_SECONDS,
              "the retry's start", cluster, run)  # fmt: skip
    started = folder_logs(folder, retry).split("training steps ", 1)[1]
    assert int(started.split("..", 1)[0]) > 1, started  # resumed, not from the first step

    # A terminate (as an eviction or `pulumi destroy` does): SIGTERM reaches every rank, which
    # stop at one step; rank 0 checkpoints and the script exits 0.
    rows = len(metrics(folder))
    wait_for(lambda: len(metrics(folder)) > rows, RUN_SECONDS, "the retry's steps", cluster, run)
    run.terminate()
    assert run.wait(60), describe(cluster, run)
    logs = folder_logs(folder, retry)
    assert "stopped by a signal at step" in logs, logs
    stopped = int(logs.split("stopped by a signal at step ", 1)[1].split(":", 1)[0])
    assert _script_checkpoints(folder)[-1] == f"step-{stopped:08d}.pt"


def test_plugins_from_a_snapshot_train_on_two_nodes_with_the_trainer(
    make_cluster, vnet, storage, cpu_stack, tmp_path, built_image
):
    example = REPO / "examples" / "custom_model"
    files = {f"custom_model/{p.name}": p for p in example.glob("*.py")}
    snap = _upload(vnet, storage, tmp_path, "team", files)
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill", image_root=built_image)
    args = {
        "model": "custom_model.model:build", "data": "custom_model.data:build",
        "num_classes": 3, "batch_size": 8, "max_steps": 6, "epochs": 9, "warmup_epochs": 1,
        "loader_workers": 0, "log_every": 1,
    }  # fmt: skip
    spec = make_spec(cpu_stack, storage, trainer=args, code_sha256=snap.sha256)
    run = submit(cluster, spec)
    assert run.wait(RUN_SECONDS), describe(cluster, run)
    assert (run.state, run.exit_code, len(run.tries)) == ("completed", 0, 1), describe(cluster, run)
    _prepared_on_every_node(cluster, run, snap)
    folder = run_folder(cluster, spec)
    assert metrics(folder)[-1]["step"] == 6, describe(cluster, run)
    assert "custom_model.model:build" in (folder / "results" / "config.yaml").read_text()
