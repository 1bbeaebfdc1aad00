"""The training job exactly as ``infra.job`` submits it, on emulated Batch nodes.

The job and task are ``job_options(spec).as_dict()`` and ``task_options(spec).as_dict()`` of a
``JobSpec`` built from a stack's declared TrainingJob, with a tiny trainer and the emulated
storage account's endpoint: the real launcher, trainer and Horovod run (CPU, Gloo). Full runs
use the dev stack as a CPU acceptance stack (``Standard_D2ds_v5``: the size's payloads start
one worker per node, which two shared cores can run); the start task's GPU and InfiniBand
checks run on the dev stack's own pool (``Standard_ND96isr_H100_v5``, 8 GPUs, 8 HCAs).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import dataclass
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
    metrics,
    run_folder,
    submit,
    wait_for,
    worker_pids,
)
from tests.batch_emulator.storage import blob
from tests.infra.batch_nodes.shared_runs import FINISHED_RUN_FIXTURES, FinishedRun, trains
from trainer.checkpoints.single_file import load_latest

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes


# Both container lifecycles (does what the coordination command leaves running survive it?),
# each with a full run: the synthetic data under the stricter one, the staged dataset under the
# other, and under both readings of the "Shared" bind mount (SHARED_READINGS in batch.py). Each
# run is a session-scoped fixture (conftest.py, READINGS) that test_job_logs.py reads too.
@pytest.mark.parametrize("readings", list(FINISHED_RUN_FIXTURES))
def test_two_node_run_completes_with_checkpoints_metrics_and_every_nodes_logs(readings, request):
    finished: FinishedRun = request.getfixturevalue(FINISHED_RUN_FIXTURES[readings])
    cluster, run, folder = finished.cluster, finished.run, finished.folder
    # A node whose preparation failed never gets the task: with two nodes the job would wait
    # forever, so that is a failure now.
    assert not run.prep_failed(), describe(cluster, run)
    assert finished.ended_in_time, describe(cluster, run)
    assert (run.state, run.exit_code, len(run.tries)) == ("completed", 0, 1), describe(cluster, run)
    assert checkpoint_steps(folder), describe(cluster, run)
    assert metrics(folder)[-1]["step"] == 6
    logs = finished.uploaded
    # The task's output files, and rank 0's live metrics (the job's --metrics-upload-url, as
    # the node's managed identity) with its TensorBoard events.
    assert {"stdout.txt", "stderr.txt", "metrics.jsonl"} <= set(logs), logs
    assert any(name.startswith("events.out.tfevents.") for name in logs), logs
    live = [json.loads(line) for line in logs["metrics.jsonl"].splitlines() if line.strip()]
    assert live == metrics(folder)  # the final upload: the whole file as it ended
    # The finished run's results, uploaded by rank 0 as the node's identity to the job's
    # --outputs-url (what `dt-jobs fetch` downloads): every file of its results/ folder.
    assert sorted(finished.results) == sorted(
        path.name for path in (folder / "results").iterdir()
    ), describe(cluster, run)
    output = logs["stdout.txt"] + logs["stderr.txt"]
    # Every node's launcher log reaches the user: the non-primary's too (in the uploaded
    # stdout, or at least in the run folder on the share).
    for node in run.nodes:
        assert f"[launch {node.ip}]" in output + folder_logs(folder), output
    assert "done: step 6" in output + folder_logs(folder), output
    if finished.readings.data == "shards":
        prefix = finished.dataset_prefix
        for node in run.nodes:
            assert run.prep_exit[node.index] == 0
            # Staged into the preparation's working folder (infra.batch.STAGE_ROOT), not the
            # node's shared folder, which the "Shared" mount may not be.
            prep_dir = run.prep_dir(node)
            assert prep_dir and (prep_dir / "wd/datasets" / prefix / "manifest.json").is_file()
            # batch-job-prep-release.md: the preparation ran before the task on the node.
            prep = next(e for e in cluster.events if f"node {node.index}: job preparation" in e)
            task = next(e for e in cluster.events if f"node {node.index}: started coord" in e)
            assert float(prep.split()[0]) <= float(task.split()[0])


# The driver's line for a GPU fallen off the bus (Xid 79, one Azure's health checks fail on).
XID_79 = "[  812.3] NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', GPU has fallen off the bus.\n"


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        # After the start task's bounded wait for ports still coming up, one line names the port.
        ({"ib_down": {1: "mlx5_ib5"}}, "found 7 after waiting 300 s: mlx5_ib5/ports/1 is"),
        ({"kernel_log": {1: XID_79}}, "GPU Xid error in the kernel log since boot: Xid (PCI:"),
    ],
    ids=["infiniband-port-down", "gpu-xid-79"],
)
def test_a_node_whose_start_task_fails_never_receives_the_task(
    make_cluster, storage, gpu_stack, fault, said
):
    """The dev stack's InfiniBand pool, one node with a port down or a GPU fallen off the bus."""
    cluster = make_cluster(gpu_stack, **fault)
    outputs = {n.index: (n.startup_dir / "stderr.txt").read_text()[-1500:] for n in cluster.nodes}
    assert [n.state for n in cluster.nodes] == ["idle", "starttaskfailed", "idle"], outputs
    assert said in outputs[1], outputs[1]
    spec = make_spec(gpu_stack, storage, trainer={**TINY, "max_steps": 2}, node_count=3)
    run = submit(cluster, spec)
    # Three instances wanted, two usable nodes: the task is never scheduled, it stays active.
    assert not run.wait(3), describe(cluster, run)
    assert run.state == "active" and "usable" in run.reason, describe(cluster, run)
    assert not run.nodes and not cluster.nodes[1].job_dir(spec.job_id).exists()
    run.terminate()
    assert run.wait(10) and not run.tries


def test_nodes_whose_image_prefetch_fails_are_unusable_and_never_receive_the_task(
    make_cluster, storage, gpu_stack
):
    """The pool prefetches the tag every build moves (infra.image.PREFETCH_TAG), which the
    stack's build pushes; a registry without it (a pool created before the push) leaves every
    node unusable, its start task never run."""
    (prefetched,) = gpu_stack.pool.prefetch_images
    assert prefetched in gpu_stack.registry_images  # the stack as declared
    without = tuple(i for i in gpu_stack.registry_images if i != prefetched)
    cluster = make_cluster(gpu_stack, registry_images=without)
    assert [n.state for n in cluster.nodes] == ["unusable"] * len(cluster.nodes)
    for node in cluster.nodes:
        (error,) = node.errors
        assert prefetched in error["message"]
        assert not (node.startup_dir / "stdout.txt").exists()  # no start task on such a node
    spec = make_spec(gpu_stack, storage, trainer={**TINY, "max_steps": 2}, node_count=2)
    run = submit(cluster, spec)
    assert not run.wait(2) and run.state == "active" and not run.nodes, describe(cluster, run)
    run.terminate()
    assert run.wait(10) and not run.tries


def test_a_killed_worker_fails_the_try_the_retry_resumes_and_a_terminate_checkpoints_all_ranks(
    retried_elsewhere_then_kept_out,
):
    retried = retried_elsewhere_then_kept_out
    cluster, run, folder = retried.cluster, retried.run, retried.folder
    # A worker on the non-primary node died: the try failed within a minute and Batch retried.
    assert run.tries[0].exit_code != 0, describe(cluster, run)
    assert retried.failed_after < 60
    assert retried.workers_in_image  # the trainer of the image `make image` built

    # The retry resumed from the newest checkpoint on the share.
    attempt = retried.retry_attempt
    assert "resumed from" in folder_logs(folder, attempt), folder_logs(folder, attempt)

    # The terminate reached every rank, which checkpointed and stopped.
    assert retried.ended_after_terminate, describe(cluster, run)
    assert run.terminated and len(run.tries) == 2, describe(cluster, run)
    logs = folder_logs(folder, attempt)
    assert logs.count("forwarding to the workers so they checkpoint") == 2, logs
    assert "stopped by signal" in logs, logs
    assert checkpoint_steps(folder)[0] > retried.newest_before_terminate, logs


def test_a_retry_on_other_nodes_with_another_master_stages_again_and_resumes(
    retried_elsewhere_then_kept_out,
):
    """Batch may retry a task on other nodes (tests/batch_emulator/placement.py, ``move``): a
    worker dies on the subtask's node; the retry leaves that node out, takes the spare node and puts
    the primary on a node that was not the master. The spare stages the dataset first (node-
    local staging does not travel) and the retry resumes from the checkpoint on the share."""
    retried = retried_elsewhere_then_kept_out
    cluster, run, spare = retried.cluster, retried.run, retried.spare
    assert retried.spare_prepared_first is None  # not prepared: the task never ran there
    assert run.tries[0].exit_code != 0 and not run.tries[0].recovered, describe(cluster, run)
    expected = ({retried.old_master.index, spare.index}, spare.index)
    assert retried.placed == expected, describe(cluster, run)
    assert run.prep_exit[spare.index] == 0, describe(cluster, run)
    prep_dir = run.prep_dir(spare)
    manifest = Path("wd/datasets") / retried.dataset_prefix / "manifest.json"
    assert prep_dir and (prep_dir / manifest).is_file()
    logs = folder_logs(retried.folder, retried.retry_attempt)
    assert "resumed from" in logs, logs
    assert retried.ended_after_terminate, describe(cluster, run)


def test_a_retry_on_another_node_and_the_rerun_go_on_in_the_jobs_one_mlflow_run(
    retried_elsewhere_then_kept_out,
):
    """The stack's trackingUri names an MLflow server in the VNet. The first try's rank 0 (on
    the old master) makes the run; the retry's rank 0, on the spare, and the rerun's find it by
    its key and go on in it: one run, named after the job, with every step the tries logged."""
    retried = retried_elsewhere_then_kept_out
    spec = retried.spec
    # One run for the three tries, not three: each node sees the share at a path of its own
    # here, so the key is where the checkpoints live (the job's checkpoint mirror).
    runs = [(r.info.run_name, r.data.tags.get("dt.run_key")) for r in retried.tracked]
    assert len(runs) == 1, runs
    (run,) = retried.tracked
    tags = run.data.tags
    assert run.info.run_name == spec.job_id
    assert tags["dt.run_key"] == spec.checkpoint_mirror_url.rstrip("/"), tags
    assert tags["dt.batch_job"] == spec.job_id
    assert run.data.params["checkpoint_every"] == "2"
    # The retry's terminate paused it (SIGTERM: the ranks checkpointed); the rerun resumed it
    # and was killed (SIGKILL leaves no moment to say so).
    assert tags["dt.stopped_by"] == "signal" and run.info.status == "RUNNING"
    steps = retried.train_steps_through_retry
    assert steps and steps <= retried.tracked_loss_steps, (steps, retried.tracked_loss_steps)


def test_evictions_requeue_the_task_without_using_its_retries_and_a_failure_still_uses_one(
    make_cluster, storage, spot_cpu_stack
):
    """Four scheduled events take a node of the job (a Spot pool: only Spot nodes are
    preempted), one after the other (MAX_TASK_RETRIES is 3: a fourth counted retry would fail
    the task); each time the job checkpoints, the event is approved unless it also names
    another job's VM, the platform takes the node and Batch's recovery requeues the task. A
    preempted node comes back under its id with an empty disk. A worker that dies afterwards
    is a real failure: a retry."""
    cpu_stack = spot_cpu_stack
    assert (cpu_stack.pool.spot_nodes, cpu_stack.pool.dedicated_nodes) == (2, 0)
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill")
    assert all(node.spot for node in cluster.nodes)
    args = {**TINY, "max_steps": 4000, "epochs": 4000, "checkpoint_every": 2}
    spec = make_spec(cpu_stack, storage, trainer=args)
    run = submit(cluster, spec)
    folder = run_folder(cluster, spec)
    attempt = None
    events = []
    plan = [
        ("Preempt", [], 60),
        # Also another job's VM: not to be approved; the platform acts at NotBefore, 8 s on:
        # the launchers see it within their 2 s poll and checkpoint well before (the approved
        # events show it: their checkpoints were written 2 to 3.5 s after the event came).
        ("Reboot", ["vm-of-another-job"], 8),
        ("Redeploy", [], 60),
        ("Terminate", [], 60),
    ]
    for index, (kind, others, notice) in enumerate(plan):
        wait_for(trains(folder, attempt, len(metrics(folder))), RUN_SECONDS, f"try {index}",
                  cluster, run)  # fmt: skip
        attempt = current_attempt(folder)
        victim = next(n for n in run.nodes if n is not run.master)
        left_on_disk = victim.shared_dir / "left-by-the-test"
        left_on_disk.write_text("local data")
        events.append(cluster.schedule_event(kind, [victim.vm_name, *others], notice))
        wait_for(lambda i=index: len(run.tries) > i, RUN_SECONDS, f"{kind} ends the try",
                  cluster, run)  # fmt: skip
        assert run.tries[index].recovered, describe(cluster, run)
        # Only a reboot keeps the VM's temporary disk (batch.DISK_LOST).
        assert left_on_disk.exists() == (kind == "Reboot"), (kind, describe(cluster, run))
        logs = folder_logs(folder, attempt)
        assert f"scheduled event {kind} {events[-1]}" in logs, logs
        assert "waiting for the platform to take this VM" in logs, logs
    assert (run.retry_count, run.requeue_count, run.finished.is_set()) == (0, 4, False), describe(
        cluster, run
    )
    assert sorted(event for _, event in cluster.approved()) == sorted(events[:1] + events[2:])
    assert "not approving Reboot" in folder_logs(folder)

    # A real failure still counts: a worker dies, the try fails, Batch retries it.
    wait_for(trains(folder, attempt, len(metrics(folder))), RUN_SECONDS, "try 4", cluster, run)
    subtask = next(n for n in run.nodes if n is not run.master)
    os.kill(worker_pids(cluster, run, subtask.index)[0], signal.SIGKILL)
    wait_for(lambda: len(run.tries) > 4, 60, "the failure", cluster, run)
    assert not run.tries[4].recovered and run.tries[4].exit_code != 0, describe(cluster, run)
    assert run.retry_count == 1 and not run.finished.is_set(), describe(cluster, run)
    run.terminate("kill")  # only ends the run: no grace to wait out
    assert run.wait(60), describe(cluster, run)


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return False
    caught = int(next(line for line in status if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & (1 << (signum - 1)))


def _launcher(run: JobRun, node_index: int) -> int | None:
    """The container's first process on a node once it is the launcher (bash exec'd it)."""
    proc = run.running.get(node_index)
    pid = proc.main_pid() if proc else None
    if pid is None:
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return pid if b"trainer.launch" in argv else None


@dataclass
class ThreeRuns:
    """The same job three times on one pool: its first run (a try failed, its share wiped
    before the retry, the retry killed), a second run stopped early, a third that resumed."""

    cluster: Cluster
    folder: Path
    # The first run: a worker killed, the share wiped before the retry, the retry killed.
    first: JobRun
    wiped: list[int]  # the checkpoints' steps the wipe removed
    retry_attempt: str
    retry_steps: list[int]  # the retry's training steps, once it logged one
    first_killed: bool  # the first run ended within 60 s of the terminate (kill)
    newest: tuple[Path, dict] | None  # the newest checkpoint the kill left
    # The second run, stopped while its non-primary launcher waited for the master.
    second: JobRun
    subtask: int  # the second run's non-primary node
    stopping: str  # the terminate's event for that node's container
    second_events: list[str]  # the pool's events from the second run's submission to its end
    second_ended: bool  # it ended within 60 s of the terminate (stop)
    subtask_output: str  # what the subtask's container wrote (stdout.txt and stderr.txt)
    subtask_workers: list[int]  # the subtask's workers once it ended
    newest_after_second: Path | None  # the newest checkpoint once it ended
    # The third run, once it resumed from the checkpoint the kill left.
    third: JobRun
    resumed: str  # how its log names that checkpoint
    third_ended: bool  # it ended within 60 s of the terminate (kill)


@pytest.fixture(scope="module")
def share_wiped_kill_stop_resume(shared_pools, vnet, storage, cpu_stack) -> ThreeRuns:
    """One job (TINY, checkpoints every two steps) on two nodes, three times:

    1. a worker dies and the NFS server is lost or replaced (its checkpoints gone) before the
       retry, which resumes from the checkpoint rank 0 mirrored to the checkpoints container
       (trainer.checkpoints.mirror, the job's --checkpoint-mirror-url); once the retry wrote
       two checkpoints, a terminate under ``kill`` (SIGKILL to every process, mid-run);
    2. the job again, terminated under ``stop`` while its non-primary launcher waits for the
       master's rendezvous (the master frozen);
    3. the job again, until it resumed from the checkpoint the kill left; then a kill.

    Read by test_a_share_wiped_between_tries_resumes_from_the_checkpoint_mirror (1) and
    test_a_kill_keeps_the_last_checkpoint_and_a_stop_reaches_a_launcher_still_meeting_the_others
    (the kill of 1, then 2 and 3)."""
    with shared_pools.make_cluster() as make_cluster:
        cluster = booted(make_cluster, cpu_stack, lifecycle="kill")
        args = {**TINY, "max_steps": 4000, "epochs": 4000, "checkpoint_every": 2}
        spec = make_spec(cpu_stack, storage, trainer=args)
        folder = run_folder(cluster, spec)

        # 1. The share wiped between the tries, the retry killed.
        mirror = spec.checkpoint_mirror_url.split("/checkpoints/", 1)[1]
        wiped: list[int] = []
        first_try_rows: list[int] = []
        original = JobRun._try

        def wipe_before_the_retry(self, attempt, instances):
            if attempt == 1:  # every process of the failed try has stopped: the share is replaced
                cluster.sync_nfs()
                wiped.extend(checkpoint_steps(folder))
                first_try_rows.append(len(metrics(folder)))
                shutil.rmtree(folder / "checkpoints")
            return original(self, attempt, instances)

        def mirrored():
            names = blob(vnet, storage, "list", container="checkpoints", prefix=mirror)
            return [n for n in names if n.endswith(".mirror.json")]

        # The retry's first step is the one after the mirrored checkpoint's (metrics.jsonl is
        # kept and appended to; the failed try may have stopped right at that checkpoint, so the
        # retry's lines are told apart by where the failed try's ended, not by a step going back).
        def retry_steps() -> list[int]:
            rows = metrics(folder)[first_try_rows[0] :]
            return [r["step"] for r in rows if r.get("kind") == "train"]

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(JobRun, "_try", wipe_before_the_retry)
            first = submit(cluster, spec)
            wait_for(mirrored, RUN_SECONDS, "a mirrored checkpoint", cluster, first)
            subtask = next(n for n in first.nodes if n is not first.master)
            workers = worker_pids(cluster, first, subtask.index)
            assert workers, describe(cluster, first)
            os.kill(workers[0], signal.SIGKILL)
            wait_for(lambda: len(first.tries) >= 1, 60, "the try's failure", cluster, first)
            # The wipe is done as the retry starts, a moment after the failed try ended.
            wait_for(lambda: first_try_rows, 60, "the share's wipe", cluster, first)
            wait_for(lambda: checkpoint_steps(folder), RUN_SECONDS, "the retry's checkpoint",
                     cluster, first)  # fmt: skip
            retry_attempt = current_attempt(folder)
            wait_for(retry_steps, RUN_SECONDS, "the retry's steps", cluster, first)
            steps = retry_steps()
            # Kill: SIGKILL to every process of the task, at once, mid-run.
            wait_for(lambda: len(checkpoint_steps(folder)) >= 2, RUN_SECONDS, "checkpoints",
                     cluster, first)  # fmt: skip
            first.terminate("kill")
            first_killed = first.wait(60)
        newest = load_latest(folder / "checkpoints")
        assert newest is not None, describe(cluster, first)

        # 2. Stop while the non-primary launcher waits for the primary's rendezvous.
        seen = len(cluster.events)  # the first run's events before
        second = submit(cluster, spec)
        wait_for(lambda: second.master is not None and len(second.running) == 2, RUN_SECONDS,
                 "the coordination commands", cluster, second)  # fmt: skip
        assert second.master is not None
        master = second.master.index
        waiting_node = next(n.index for n in second.nodes if n is not second.master)
        wait_for(lambda: _launcher(second, master) is not None, 60, "the launcher", cluster,
                 second)  # fmt: skip
        master_pid = _launcher(second, master)
        assert master_pid is not None
        os.kill(master_pid, signal.SIGSTOP)
        stopping = f"terminate: SIGTERM to coord-n{waiting_node}"
        try:
            wait_for(lambda: _launcher(second, waiting_node) is not None, RUN_SECONDS,
                     "the launcher", cluster, second)  # fmt: skip
            waiting = _launcher(second, waiting_node)
            assert waiting is not None
            what = "a SIGTERM handler in the launcher waiting for the master"
            wait_for(lambda: _catches(waiting, signal.SIGTERM), 60, what, cluster, second)
            second.terminate("stop")
            wait_for(lambda: any(stopping in e for e in cluster.events[seen:]), 30, "the stop",
                     cluster, second)  # fmt: skip
        finally:
            os.kill(master_pid, signal.SIGCONT)
        second_ended = second.wait(60)
        # What the second run left, read before the third's try empties the task folders.
        task_dir = second.task_dir(cluster.nodes[waiting_node])
        output = (task_dir / "stdout.txt").read_text() + (task_dir / "stderr.txt").read_text()
        second_events = cluster.events[seen:]
        subtask_workers = worker_pids(cluster, second, waiting_node)
        after_second = load_latest(folder / "checkpoints")

        # 3. The next run resumes from the checkpoint the kill left.
        third = submit(cluster, spec)
        resumed = f"{newest[0].name} at step {int(newest[1]['step'])} "  # as the node sees it
        wait_for(lambda: resumed in folder_logs(folder), RUN_SECONDS, f"resumed from {resumed}",
                 cluster, third)  # fmt: skip
        third.terminate("kill")  # only ends the run: no grace to wait out
        third_ended = third.wait(60)
    return ThreeRuns(
        cluster=cluster, folder=folder, first=first, wiped=wiped,
        retry_attempt=retry_attempt, retry_steps=steps,
        first_killed=first_killed, newest=newest, second=second, subtask=waiting_node,
        stopping=stopping, second_events=second_events, second_ended=second_ended,
        subtask_output=output, subtask_workers=subtask_workers,
        newest_after_second=after_second[0] if after_second else None, third=third,
        resumed=resumed, third_ended=third_ended,
    )  # fmt: skip


def test_a_kill_keeps_the_last_checkpoint_and_a_stop_reaches_a_launcher_still_meeting_the_others(
    share_wiped_kill_stop_resume,
):
    """Batch documents no signal for a terminate (``STOP_MODES`` in
    tests/batch_emulator/job_run.py): both readings. Under ``kill`` nothing can react: the newest
    periodic checkpoint must be intact and the next run of the job resumes from it. Under ``stop``
    only the container's first process gets SIGTERM, and only if it has a handler (PID 1): the
    launcher must have one from its first instant, also while it still waits for the master's
    rendezvous (frozen here), and then must not start workers it would have to stop."""
    runs = share_wiped_kill_stop_resume
    cluster = runs.cluster
    # Kill: SIGKILL to every process of the task, at once, mid-run (the first run's retry).
    assert runs.first_killed and runs.first.terminated, describe(cluster, runs.first)
    assert runs.newest is not None, describe(cluster, runs.first)

    # Stop while the non-primary launcher waited for the primary's rendezvous.
    second = runs.second
    assert runs.second_ended and second.terminated, describe(cluster, second)
    stop = next(e for e in runs.second_events if runs.stopping in e)
    assert "sent to PID 1" in stop, describe(cluster, second)
    assert "before the workers started" in runs.subtask_output, describe(cluster, second)
    killed = f"terminate: SIGKILL to coord-n{runs.subtask}"
    assert killed not in "\n".join(runs.second_events), describe(cluster, second)
    assert not runs.subtask_workers
    assert runs.newest_after_second == runs.newest[0], describe(cluster, second)

    # The next run resumed from the checkpoint the kill left.
    assert runs.resumed in folder_logs(runs.folder), describe(cluster, runs.third)
    assert runs.third_ended, describe(cluster, runs.third)


def test_a_share_wiped_between_tries_resumes_from_the_checkpoint_mirror(
    share_wiped_kill_stop_resume,
):
    """The NFS server is lost or replaced (its checkpoints gone) while a try fails: the retry
    resumes from the checkpoint the job's rank 0 mirrored to the checkpoints container
    (trainer.checkpoints.mirror, the job's --checkpoint-mirror-url), not from step 0."""
    runs = share_wiped_kill_stop_resume
    logs = folder_logs(runs.folder, runs.retry_attempt)
    assert runs.wiped, describe(runs.cluster, runs.first)
    assert "resuming from the mirror's step-" in logs, logs
    resumed = int(logs.split("resuming from the mirror's step-", 1)[1][:9])
    assert 0 < resumed <= runs.wiped[0]  # at most the steps since the last mirrored checkpoint lost
    # The retry's first step is the one after the mirrored checkpoint's.
    assert runs.retry_steps[0] == resumed + 1, runs.retry_steps
    assert runs.first_killed, describe(runs.cluster, runs.first)
