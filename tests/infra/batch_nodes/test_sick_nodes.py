"""A node whose rank fails a try, on emulated Batch nodes: every launcher's log names it by its
address and Batch node id. A node that then fails its own checks keeps itself out: it restarts
under the running task, its start task refuses it, and Batch's recovery runs the task on the
other nodes, resuming from the failed try's checkpoint. A node that passes can be kept out by
the operator (``dt-jobs keep-out``, Batch's disable scheduling)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.batch_emulator.cluster import Cluster
from tests.batch_emulator.job_run import JobRun
from tests.batch_emulator.jobs import (
    RUN_SECONDS,
    TINY,
    booted,
    checkpoint_steps,
    current_attempt,
    describe,
    folder_logs,
    make_spec,
    run_folder,
    submit,
    wait_for,
    worker_pids,
)
from tests.batch_emulator.vm_events import GUEST_RESTART_READINGS
from trainer.launch.records import KEEP_OUT_HINT

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes


# Longer than any test waits: a test ends the job itself.
LONG_RUN = {**TINY, "max_steps": 4000, "epochs": 4000, "checkpoint_every": 2}


def _checkpointed_run(cluster: Cluster, stack, storage) -> tuple[JobRun, Path]:
    """A LONG_RUN job on two of the cluster's nodes, once it wrote a checkpoint; its folder."""
    spec = make_spec(stack, storage, trainer=LONG_RUN)
    run = submit(cluster, spec)
    folder = run_folder(cluster, spec)
    wait_for(lambda: checkpoint_steps(folder), RUN_SECONDS, "a checkpoint", cluster, run)
    return run, folder


def test_a_failed_rank_names_its_node_and_a_kept_out_node_gets_no_more_tries(
    retried_elsewhere_then_kept_out,
):
    """conftest.py's retried_elsewhere_then_kept_out: on three nodes, a worker of the first try
    died (Batch retried the run on the other nodes; it was terminated), then the operator kept
    its node out and ran the job again."""
    retried = retried_elsewhere_then_kept_out
    cluster, sick, folder = retried.cluster, retried.sick, retried.folder
    # Every node's log names the node whose worker died, by address and Batch node id; the
    # try's report (the primary's output) ends with what the operator can do about it.
    named = f"node {sick.ip} ({sick.id}) worker 0 exited with -9"
    logs = folder_logs(folder, retried.first_attempt)
    assert logs.count(named) >= 2, logs  # its own launcher's line and the master's
    report = retried.reports[0]
    assert f"failed: {named}" in report and KEEP_OUT_HINT in report, report

    # The operator kept it out and ran the job again (pulumi up --replace): the job's nodes
    # were the two others, and it resumed from the newest checkpoint.
    assert retried.ended_after_terminate, describe(cluster, retried.run)
    assert retried.keep_out_code == 0
    assert f"node {sick.id} takes no new task" in retried.keep_out_output
    again = retried.again
    nodes = retried.again_nodes
    assert sick not in nodes and len(nodes) == 2, describe(cluster, again)
    assert "resumed from" in folder_logs(folder, retried.again_attempt), describe(cluster, again)
    assert retried.again_ended, describe(cluster, again)


# ext4 after an I/O error on the node's disk (fs/ext4/super.c): the node fails whatever it runs.
READ_ONLY_DISK = (
    "[ 1204.55] EXT4-fs error (device sdb1): ext4_journal_check_start:83: Detected aborted "
    "journal\n[ 1204.56] EXT4-fs (sdb1): Remounting filesystem read-only\n"
)


@pytest.mark.parametrize("guest_restart", GUEST_RESTART_READINGS)
def test_a_node_that_fails_its_checks_after_a_failed_try_keeps_itself_out_of_the_retry(
    make_cluster, storage, cpu_stack, guest_restart
):
    options = {"nodes": 3, "lifecycle": "kill", "guest_restart": guest_restart}
    cluster = booted(make_cluster, cpu_stack, **options)
    run, folder = _checkpointed_run(cluster, cpu_stack, storage)
    sick = next(n for n in run.nodes if n is not run.master)
    healthy = run.master
    first = current_attempt(folder)
    # The node's disk fails under the run: the kernel remounts it read-only; its worker dies.
    with sick.kmsg.open("a") as log:
        log.write(READ_ONLY_DISK)
    os.kill(worker_pids(cluster, run, sick.index)[0], signal.SIGKILL)

    # Every failed node asked its watcher; the sick one records why, restarts under the running
    # task (Batch's recovery: no retry used; or, under the other reading, a failed try), and its
    # start task refuses it from then on.
    wait_for(lambda: run.tries, 120, "the try's end", cluster, run)
    recovered = guest_restart == "recovery"
    assert run.tries[0].recovered == recovered, describe(cluster, run)
    assert run.retry_count == (0 if recovered else 1), describe(cluster, run)
    reason = "a file system failed since boot: EXT4-fs (sdb1): Remounting filesystem read-only"
    kept_out = f"node {sick.ip} ({sick.id}) failed its checks and keeps itself out of the pool"
    # The sick node records why before it restarts.
    wait_for(lambda: f"{kept_out}: {reason}" in folder_logs(folder, first), 60,
             "the sick node's record", cluster, run)  # fmt: skip
    wait_for(lambda: sick.state == "starttaskfailed", 60, "the start task's refusal", cluster, run)
    refusal = (sick.startup_dir / "stderr.txt").read_text()
    assert f"start task: this node kept itself out of the pool: {reason} since 20" in refusal
    assert f"--node-list {sick.id}, as Owner or Contributor of the stack" in refusal
    assert sick.kmsg.read_text() == ""  # the restart emptied the log: the record holds it out

    # The task runs again on the two other nodes and resumes.
    wait_for(lambda: run.state == "running" and sick not in run.nodes, RUN_SECONDS,
              "the task's next try", cluster, run)  # fmt: skip
    assert healthy in run.nodes and len(run.nodes) == 2, describe(cluster, run)
    # The healthy node asks its own watcher as its launcher ends. Whether the answer reaches the
    # run folder is a race it may lose in either reading: the sick node's restart ends the try,
    # and Batch stops every node's part of it, the healthy launcher too, maybe before the
    # answer (seen on a busy machine: "asking this node's watcher" and no answer). Its next
    # try has begun, so that launcher is gone: if it answered, it passed.
    healthy_lines = [
        line for line in folder_logs(folder, first).splitlines() if f"[launch {healthy.ip}]" in line
    ]
    assert not [line for line in healthy_lines if "failed its checks" in line], healthy_lines
    answers = [line for line in healthy_lines if "its checks" in line]
    assert all("the node passed its checks" in line for line in answers), healthy_lines
    wait_for(lambda: "resumed from" in folder_logs(folder, current_attempt(folder)),
              RUN_SECONDS, "the resume", cluster, run)  # fmt: skip
    run.terminate("kill")
    assert run.wait(60), describe(cluster, run)
