"""A node whose rank fails a try, on emulated Batch nodes: every launcher's log names it by its
address and Batch node id, the try's report says how to keep it out, and once the operator has
(``dt-jobs keep-out``, Batch's disable scheduling) the job's next run lands on the other nodes
and resumes from the failed try's checkpoint."""

from __future__ import annotations

import io
import os
import signal

import pytest

from dt_commands.jobs.keep_out import keep_out
from tests.infra.batch_nodes.batch import JobRun, NodeScheduling
from tests.infra.batch_nodes.test_training_job import (
    RUN_SECONDS,
    TINY,
    _checkpoints,
    _current_attempt,
    _folder_logs,
    _wait_for,
    _worker_pids,
    booted,
    describe,
    make_spec,
    run_folder,
    submit,
)
from trainer.launch.records import KEEP_OUT_HINT

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes


def test_a_failed_rank_names_its_node_and_a_kept_out_node_gets_no_more_tries(
    make_cluster, storage, cpu_stack, monkeypatch
):
    cluster = booted(make_cluster, cpu_stack, nodes=3, lifecycle="kill")
    # The primary's output as each try ends (a retry on the same node writes it again).
    reports: list[str] = []
    original = JobRun._try

    def keep_the_report(self, attempt, instances):
        result = original(self, attempt, instances)
        path = self.task_dir(self.master) / "stdout.txt"
        reports.append(path.read_text() if path.exists() else "")
        return result

    monkeypatch.setattr(JobRun, "_try", keep_the_report)
    args = (*TINY, "--max-steps", "4000", "--epochs", "4000", "--checkpoint-every", "2")
    spec = make_spec(cpu_stack, storage, trainer_args=args)
    run = submit(cluster, spec)
    folder = run_folder(cluster, spec)
    _wait_for(lambda: _checkpoints(folder), RUN_SECONDS, "a checkpoint", cluster, run)
    sick = next(n for n in run.nodes if n is not run.master)
    first = _current_attempt(folder)
    os.kill(_worker_pids(cluster, run, sick.index)[0], signal.SIGKILL)
    _wait_for(lambda: run.tries, 60, "the try's failure", cluster, run)

    # Every node's log names the node whose worker died, by address and Batch node id; the
    # try's report (the primary's output) ends with what the operator can do about it.
    named = f"node {sick.ip} ({sick.id}) worker 0 exited with -9"
    logs = _folder_logs(folder, first)
    assert logs.count(named) >= 2, logs  # its own launcher's line and the master's
    report = reports[0]
    assert f"failed: {named}" in report and KEEP_OUT_HINT in report, report

    # The operator keeps it out and runs the job again (pulumi up --replace): the job's nodes
    # are the two others, and it resumes from the newest checkpoint.
    run.terminate()
    assert run.wait(60), describe(cluster, run)
    out = io.StringIO()
    assert keep_out(NodeScheduling(cluster), cluster.pool.pool_id, [sick.id], False, out) == 0
    assert f"node {sick.id} takes no new task" in out.getvalue()
    again = submit(cluster, make_spec(cpu_stack, storage, trainer_args=args))
    _wait_for(lambda: again.state == "running", RUN_SECONDS, "the rerun's start", cluster, again)
    assert sick not in again.nodes and len(again.nodes) == 2, describe(cluster, again)
    _wait_for(lambda: "resumed from" in _folder_logs(folder, _current_attempt(folder)),
              RUN_SECONDS, "the rerun's resume", cluster, again)  # fmt: skip
    again.terminate("kill")
    assert again.wait(60), describe(cluster, again)
