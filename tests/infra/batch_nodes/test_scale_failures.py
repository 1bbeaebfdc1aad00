"""Failures at scale on emulated Batch nodes, each injected on one node of a two-node job: a rank
blocked inside a collective (the step watchdog names it, the task fails, Batch's retry resumes
from the last checkpoint and finishes) and a rank whose data arrives late (named as the
straggler, with its node's host)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from infra.batch import job_options, task_options
from tests.batch_emulator import REPO
from tests.batch_emulator.jobs import (
    RUN_SECONDS,
    booted,
    current_attempt,
    describe,
    folder_logs,
    job_code,
    make_spec,
    metrics,
    run_folder,
)
from trainer.common.exit_codes import WATCHDOG_EXIT

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes

TESTS = REPO / "tests" / "trainer"  # where the tests' own plug-ins live

SMALL = {"num_classes": 3, "batch_size": 8, "warmup_epochs": 1, "loader_workers": 0, "epochs": 9}


def _submit(cluster, spec, env: dict[str, str]):
    """The job as infra.job submits it, with ``env`` added to its task's environment."""
    task = task_options(spec).as_dict()
    task.setdefault("environmentSettings", [])
    task["environmentSettings"] += [{"name": k, "value": v} for k, v in env.items()]
    return cluster.submit(job_options(spec).as_dict(), task)


def test_a_rank_blocked_in_a_collective_is_named_and_the_retry_resumes(
    make_cluster, vnet, storage, cpu_stack, tmp_path
):
    # The stuck model is the job's own code, as a team would give it (the image has none).
    snap = job_code(vnet, storage, tmp_path, {"stuck_rank.py": TESTS / "watch" / "stuck_rank.py"})
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill")
    args = {
        "backend": "ddp", "model": "stuck_rank:build", "image_size": 16, "synthetic_size": 256,
        **SMALL, "max_steps": 8, "checkpoint_every": 2, "log_every": 1,
        "step_timeout_minutes": 0.15,
    }  # fmt: skip
    spec = make_spec(cpu_stack, storage, trainer=args, code_sha256=snap.sha256)
    # Rank 1 (torch ranks the master's workers first: rank 1 is the other node's) blocks in a
    # recv nobody answers at its third step, after the step-2 checkpoint, on the first try only.
    run = _submit(cluster, spec, {"STUCK_RANK": "1", "STUCK_STEP": "3"})
    assert run.wait(RUN_SECONDS), describe(cluster, run)
    assert (run.state, run.exit_code, len(run.tries)) == ("completed", 0, 2), describe(cluster, run)
    assert run.tries[0].exit_code == WATCHDOG_EXIT, describe(cluster, run)
    folder = run_folder(cluster, spec)
    stuck = next(n for n in run.nodes if n is not run.master)
    logs = folder_logs(folder)
    # Every rank's watchdog names the stuck rank and its host; the launchers name the node.
    assert f"rank 1 on host {stuck.hostname}" in logs, logs
    assert f"node {stuck.ip} ({stuck.id}): the step watchdog fired on worker 0" in logs, logs
    (stacks,) = (folder / "watchdog").glob("rank-1-*.stacks.txt")
    assert "in maybe_block_in_a_collective" in stacks.read_text()
    # The retry resumed from the step-2 checkpoint and trained to the end.
    retry = folder_logs(folder, current_attempt(folder))
    assert "at step 2 (epoch 0)" in retry and "error: watchdog" not in retry, retry
    assert [r for r in metrics(folder) if r.get("kind") == "train"][-1]["step"] == 8


def test_a_rank_whose_data_arrives_late_is_named_with_its_nodes_host(
    make_cluster, vnet, storage, cpu_stack, tmp_path
):
    # The plug-ins are the job's own code, laid out as the slow data imports them.
    example = REPO / "examples"
    files = {str(p.relative_to(REPO)): p for p in (example / "__init__.py",
             *(example / "custom_model").glob("*.py"))}  # fmt: skip
    files["slow_node_data.py"] = TESTS / "slow_node_data.py"
    snap = job_code(vnet, storage, tmp_path, files)
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill")
    # Named when its data wait exceeds half the others' step, which waits for it in the
    # allreduce: its 8 samples of 0.1 s (0.8 s a step) must outweigh a step's own work, which a
    # busy machine stretches (at 0.02 s a sample, 0.16 s a step, a loaded run named the slow
    # node for its compute alone, twice, and never for its data).
    args = {
        "model": "examples.custom_model.model:build", "data": "slow_node_data:build",
        "data_args": {"seconds": 0.1}, **SMALL, "max_steps": 16, "straggler_every": 4,
        "log_every": 4,
    }  # fmt: skip
    spec = make_spec(cpu_stack, storage, trainer=args, code_sha256=snap.sha256)
    run = _submit(cluster, spec, {})
    assert run.wait(RUN_SECONDS), describe(cluster, run)
    assert (run.state, run.exit_code, len(run.tries)) == ("completed", 0, 1), describe(cluster, run)
    folder = run_folder(cluster, spec)
    slow = next(n for n in run.nodes if n is not run.master)
    named = [r for r in metrics(folder) if r.get("kind") == "straggler"]
    # On a busy machine any rank may be late once in a while (its loader or its step starved of
    # a core for a window), and be named then; the rank whose data is late in every window is
    # the one named for its data wait, and more often than any other rank for anything.
    waits = Counter(r["host"] for r in named if r["metric"] == "data_wait_sec")
    assert waits and waits.most_common(1)[0][0] == slow.hostname, named
    others = Counter(r["host"] for r in named if r["host"] != slow.hostname)
    assert all(count < waits[slow.hostname] for count in others.values()), named
    assert f"on {slow.hostname}: data_wait_sec" in folder_logs(folder), describe(cluster, run)
    summary = json.loads((folder / "results" / "metrics.json").read_text())
    # The run's summary: the rank slow in the most windows is the slow node's, for its data.
    top = max(summary["stragglers"], key=lambda entry: entry["windows"])
    assert (top["host"], top["metric"]) == (slow.hostname, "data_wait_sec"), summary
