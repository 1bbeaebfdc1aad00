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
import time
from pathlib import Path

import pytest

from infra.job_spec import JobSpec
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
from tests.batch_emulator.nfs_view import NFS_VIEW_LONG_SECONDS, NFS_VIEW_SECONDS
from tests.batch_emulator.storage import blob
from trainer.checkpoints.single_file import load_latest

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes

SHARDS = {
    "model": "tiny", "num_classes": 3, "image_size": 16, "batch_size": 2, "warmup_epochs": 1,
    "loader_workers": 0, "log_every": 1,
}  # fmt: skip


def uploaded(vnet, storage, spec: JobSpec) -> dict[str, str]:
    names = blob(vnet, storage, "list", container="logs", prefix=f"{spec.job_id}/")
    return {
        name.rsplit("/", 1)[1]: blob(vnet, storage, "download", container="logs", blob=name)
        for name in names
    }


# Both container lifecycles (does what the coordination command leaves running survive it?),
# each with a full run: the synthetic data under the stricter one, the staged dataset under the
# other, and under both readings of the "Shared" bind mount (SHARED_READINGS in batch.py).
@pytest.mark.parametrize(
    ("lifecycle", "data", "shared"),
    [
        pytest.param("kill", "synthetic", "node", id="kill"),
        pytest.param("survive", "shards", "node", id="survive-shared-node"),
        pytest.param("survive", "shards", "task", id="survive-shared-task"),
    ],
)
def test_two_node_run_completes_with_checkpoints_metrics_and_every_nodes_logs(
    make_cluster, vnet, storage, cpu_stack, lifecycle, data, shared, request
):
    # The stricter lifecycle's run also takes the long NFS delays: a report that read the other
    # node's outcome before it could be in its view fails there first.
    bound = NFS_VIEW_LONG_SECONDS if lifecycle == "kill" else NFS_VIEW_SECONDS
    cluster = booted(make_cluster, cpu_stack, lifecycle=lifecycle, shared=shared,
                     nfs_view=(0, bound))  # fmt: skip
    if data == "synthetic":
        args, prefix = {**TINY, "max_steps": 6, "epochs": 9}, ""
    else:
        prefix = request.getfixturevalue("dataset_prefix")
        args = {**SHARDS, "max_steps": 6, "epochs": 9}
    spec = make_spec(cpu_stack, storage, trainer=args, dataset_prefix=prefix)
    run = submit(cluster, spec)
    # A node whose preparation failed never gets the task: with two nodes the job would wait
    # forever, so that is a failure now.
    wait_for(lambda: run.finished.is_set() or run.prep_failed(), RUN_SECONDS, "the run's end",
              cluster, run)  # fmt: skip
    assert not run.prep_failed(), describe(cluster, run)
    assert run.wait(RUN_SECONDS), describe(cluster, run)
    assert (run.state, run.exit_code, len(run.tries)) == ("completed", 0, 1), describe(cluster, run)
    folder = run_folder(cluster, spec)
    assert checkpoint_steps(folder), describe(cluster, run)
    assert metrics(folder)[-1]["step"] == 6
    logs = uploaded(vnet, storage, spec)
    # The task's output files, and rank 0's live metrics (the job's --metrics-upload-url, as
    # the node's managed identity) with its TensorBoard events.
    assert {"stdout.txt", "stderr.txt", "metrics.jsonl"} <= set(logs), logs
    assert any(name.startswith("events.out.tfevents.") for name in logs), logs
    live = [json.loads(line) for line in logs["metrics.jsonl"].splitlines() if line.strip()]
    assert live == metrics(folder)  # the final upload: the whole file as it ended
    # The finished run's results, uploaded by rank 0 as the node's identity to the job's
    # --outputs-url (what `dt-jobs fetch` downloads): every file of its results/ folder.
    job_prefix = f"{spec.job_id}/"
    results = blob(vnet, storage, "list", container="outputs", prefix=job_prefix)
    assert sorted(name.removeprefix(job_prefix) for name in results) == sorted(
        path.name for path in (folder / "results").iterdir()
    ), describe(cluster, run)
    output = logs["stdout.txt"] + logs["stderr.txt"]
    # Every node's launcher log reaches the user: the non-primary's too (in the uploaded
    # stdout, or at least in the run folder on the share).
    for node in run.nodes:
        assert f"[launch {node.ip}]" in output + folder_logs(folder), output
    assert "done: step 6" in output + folder_logs(folder), output
    if data == "shards":
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


def test_a_killed_worker_fails_the_try_the_retry_resumes_and_a_terminate_checkpoints_all_ranks(
    make_cluster, storage, cpu_stack
):
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill")
    args = {**TINY, "max_steps": 4000, "epochs": 4000, "checkpoint_every": 2}
    spec = make_spec(cpu_stack, storage, trainer=args)
    run = submit(cluster, spec)
    folder = run_folder(cluster, spec)
    wait_for(lambda: checkpoint_steps(folder), RUN_SECONDS, "a checkpoint", cluster, run)

    # A worker on the non-primary node dies: the try fails within a minute, every node's part
    # of it stops (batch-mpi.md: a subtask failure fails the task) and Batch retries.
    subtask = next(n for n in run.nodes if n is not run.master)
    workers = worker_pids(cluster, run, subtask.index)
    assert workers, describe(cluster, run)
    killed_at = time.monotonic()
    os.kill(workers[0], signal.SIGKILL)
    wait_for(lambda: run.tries, 60, "the try's failure", cluster, run)
    assert run.tries[0].exit_code != 0, describe(cluster, run)
    assert time.monotonic() - killed_at < 60

    # The retry resumes from the newest checkpoint on the share.
    resumed = len(metrics(folder))
    wait_for(lambda: len(metrics(folder)) > resumed + 1, RUN_SECONDS, "retry steps", cluster, run)
    attempt = current_attempt(folder)
    assert "resumed from" in folder_logs(folder, attempt), folder_logs(folder, attempt)

    # A terminate reaches every rank, which checkpoint and stop.
    before = checkpoint_steps(folder)[0]
    run.terminate()
    assert run.wait(60), describe(cluster, run)
    assert run.terminated and len(run.tries) == 2, describe(cluster, run)
    logs = folder_logs(folder, attempt)
    assert logs.count("forwarding to the workers so they checkpoint") == 2, logs
    assert "stopped by signal" in logs, logs
    assert checkpoint_steps(folder)[0] > before, logs


def test_a_retry_on_other_nodes_with_another_master_stages_again_and_resumes(
    make_cluster, storage, cpu_stack, dataset_prefix
):
    """Batch may retry a task on other nodes (tests/batch_emulator/placement.py, ``move``): a
    worker dies on the subtask's node; the retry leaves that node out, takes the spare node and puts
    the primary on a node that was not the master. The spare stages the dataset first (node-
    local staging does not travel) and the retry resumes from the checkpoint on the share."""
    cluster = booted(make_cluster, cpu_stack, nodes=3, lifecycle="kill", placement="move")
    args = {**SHARDS, "max_steps": 4000, "epochs": 4000, "checkpoint_every": 2}
    spec = make_spec(cpu_stack, storage, trainer=args, dataset_prefix=dataset_prefix)
    run = submit(cluster, spec)
    folder = run_folder(cluster, spec)
    wait_for(lambda: checkpoint_steps(folder), RUN_SECONDS, "a checkpoint", cluster, run)
    first, old_master = list(run.nodes), run.master
    assert old_master is not None
    (spare,) = [n for n in cluster.nodes if n not in first]
    assert run.prep_exit.get(spare.index) is None  # not prepared: the task never ran there
    subtask = next(n for n in first if n is not old_master)
    run.leave_out = subtask
    os.kill(worker_pids(cluster, run, subtask.index)[0], signal.SIGKILL)
    wait_for(lambda: run.tries, 60, "the try's failure", cluster, run)
    assert run.tries[0].exit_code != 0 and not run.tries[0].recovered, describe(cluster, run)

    attempt = current_attempt(folder)
    wait_for(_trains(folder, attempt, len(metrics(folder))), RUN_SECONDS, "retry steps",
              cluster, run)  # fmt: skip
    placed = ({n.index for n in run.nodes}, run.master and run.master.index)
    assert placed == ({old_master.index, spare.index}, spare.index), describe(cluster, run)
    assert run.prep_exit[spare.index] == 0, describe(cluster, run)
    prep_dir = run.prep_dir(spare)
    assert prep_dir and (prep_dir / "wd/datasets" / dataset_prefix / "manifest.json").is_file()
    logs = folder_logs(folder, current_attempt(folder))
    assert "resumed from" in logs, logs
    run.terminate("kill")  # only ends the run: no grace to wait out
    assert run.wait(60), describe(cluster, run)


def _trains(folder: Path, after_attempt: str | None, metrics_before: int):
    """A condition: a try later than ``after_attempt`` runs and has logged a step."""

    def condition() -> bool:
        try:
            attempt = current_attempt(folder)
        except (OSError, ValueError):
            return False
        return attempt != after_attempt and len(metrics(folder)) > metrics_before

    return condition


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
        wait_for(_trains(folder, attempt, len(metrics(folder))), RUN_SECONDS, f"try {index}",
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
    wait_for(_trains(folder, attempt, len(metrics(folder))), RUN_SECONDS, "try 4", cluster, run)
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


def test_a_kill_keeps_the_last_checkpoint_and_a_stop_reaches_a_launcher_still_meeting_the_others(
    make_cluster, storage, cpu_stack
):
    """Batch documents no signal for a terminate (``STOP_MODES`` in
    tests/batch_emulator/job_run.py): both readings. Under ``kill`` nothing can react: the newest
    periodic checkpoint must be intact and the next run of the job resumes from it. Under ``stop``
    only the container's first process gets SIGTERM, and only if it has a handler (PID 1): the
    launcher must have one from its first instant, also while it still waits for the master's
    rendezvous (frozen here), and then must not start workers it would have to stop."""
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill")
    args = {**TINY, "max_steps": 4000, "epochs": 4000, "checkpoint_every": 2}
    spec = make_spec(cpu_stack, storage, trainer=args)
    folder = run_folder(cluster, spec)

    # Kill: SIGKILL to every process of the task, at once, mid-run.
    run = submit(cluster, spec)
    wait_for(lambda: len(checkpoint_steps(folder)) >= 2, RUN_SECONDS, "checkpoints", cluster, run)
    run.terminate("kill")
    assert run.wait(60) and run.terminated, describe(cluster, run)
    newest = load_latest(folder / "checkpoints")
    assert newest is not None, describe(cluster, run)
    kept = int(newest[1]["step"])

    # Stop while the non-primary launcher waits for the primary's rendezvous.
    seen = len(cluster.events)  # the kill's events before
    run = submit(cluster, spec)
    wait_for(lambda: run.master is not None and len(run.running) == 2, RUN_SECONDS,
              "the coordination commands", cluster, run)  # fmt: skip
    assert run.master is not None
    master = run.master.index
    subtask = next(n.index for n in run.nodes if n is not run.master)
    wait_for(lambda: _launcher(run, master) is not None, 60, "the launcher", cluster, run)
    master_pid = _launcher(run, master)
    assert master_pid is not None
    os.kill(master_pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _launcher(run, subtask) is not None, RUN_SECONDS, "the launcher",
                  cluster, run)  # fmt: skip
        waiting = _launcher(run, subtask)
        assert waiting is not None
        what = "a SIGTERM handler in the launcher waiting for the master"
        wait_for(lambda: _catches(waiting, signal.SIGTERM), 60, what, cluster, run)
        run.terminate("stop")
        stopping = f"terminate: SIGTERM to coord-n{subtask}"
        wait_for(lambda: any(stopping in e for e in cluster.events[seen:]), 30, "the stop",
                  cluster, run)  # fmt: skip
    finally:
        os.kill(master_pid, signal.SIGCONT)
    assert run.wait(60) and run.terminated, describe(cluster, run)
    stop = next(e for e in cluster.events[seen:] if stopping in e)
    assert "sent to PID 1" in stop, describe(cluster, run)
    output = (run.task_dir(cluster.nodes[subtask]) / "stdout.txt").read_text()
    output += (run.task_dir(cluster.nodes[subtask]) / "stderr.txt").read_text()
    assert "before the workers started" in output, describe(cluster, run)
    killed = f"terminate: SIGKILL to coord-n{subtask}"
    assert killed not in "\n".join(cluster.events[seen:]), describe(cluster, run)
    assert not worker_pids(cluster, run, subtask)
    assert load_latest(folder / "checkpoints")[0] == newest[0], describe(cluster, run)

    # The next run resumes from the checkpoint the kill left.
    run = submit(cluster, spec)
    resumed = f"{newest[0].name} at step {kept} "  # the path as the node sees it ends so
    wait_for(lambda: resumed in folder_logs(folder), RUN_SECONDS, f"resumed from {resumed}",
              cluster, run)  # fmt: skip
    run.terminate("kill")
    assert run.wait(60), describe(cluster, run)


def test_a_share_wiped_between_tries_resumes_from_the_checkpoint_mirror(
    make_cluster, vnet, storage, cpu_stack, monkeypatch
):
    """The NFS server is lost or replaced (its checkpoints gone) while a try fails: the retry
    resumes from the checkpoint the job's rank 0 mirrored to the checkpoints container
    (trainer.checkpoints.mirror, the job's --checkpoint-mirror-url), not from step 0."""
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill")
    args = {**TINY, "max_steps": 4000, "epochs": 4000, "checkpoint_every": 2}
    spec = make_spec(cpu_stack, storage, trainer=args)
    folder = run_folder(cluster, spec)
    mirror = spec.checkpoint_mirror_url.split("/checkpoints/", 1)[1]
    wiped: list[int] = []
    first_try_rows: list[int] = []  # how many lines of metrics.jsonl the failed try wrote
    original = JobRun._try

    def wipe_before_the_retry(self, attempt, instances):
        if attempt == 1:  # every process of the failed try has stopped: the share is replaced
            cluster.sync_nfs()
            wiped.extend(checkpoint_steps(folder))
            first_try_rows.append(len(metrics(folder)))
            shutil.rmtree(folder / "checkpoints")
        return original(self, attempt, instances)

    monkeypatch.setattr(JobRun, "_try", wipe_before_the_retry)
    run = submit(cluster, spec)

    def mirrored():
        names = blob(vnet, storage, "list", container="checkpoints", prefix=mirror)
        return [n for n in names if n.endswith(".mirror.json")]

    wait_for(mirrored, RUN_SECONDS, "a mirrored checkpoint", cluster, run)
    subtask = next(n for n in run.nodes if n is not run.master)
    workers = worker_pids(cluster, run, subtask.index)
    assert workers, describe(cluster, run)
    os.kill(workers[0], signal.SIGKILL)
    wait_for(lambda: len(run.tries) >= 1, 60, "the try's failure", cluster, run)
    wait_for(lambda: checkpoint_steps(folder), RUN_SECONDS, "the retry's checkpoint", cluster, run)
    attempt = current_attempt(folder)
    logs = folder_logs(folder, attempt)
    assert wiped, describe(cluster, run)
    assert "resuming from the mirror's step-" in logs, logs
    resumed = int(logs.split("resuming from the mirror's step-", 1)[1][:9])
    assert 0 < resumed <= wiped[0]  # at most the steps since the last mirrored checkpoint lost

    # The retry's first step is the one after the mirrored checkpoint's (metrics.jsonl is kept
    # and appended to; the failed try may have stopped right at that checkpoint, so the retry's
    # lines are told apart by where the failed try's ended, not by a step going back).
    def retry_steps() -> list[int]:
        rows = metrics(folder)[first_try_rows[0] :]
        return [r["step"] for r in rows if r.get("kind") == "train"]

    wait_for(retry_steps, RUN_SECONDS, "the retry's steps", cluster, run)
    assert retry_steps()[0] == resumed + 1, retry_steps()
    run.terminate("kill")  # only ends the run: no grace to wait out
    assert run.wait(60), describe(cluster, run)
