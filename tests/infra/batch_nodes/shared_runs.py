"""Runs that tests of several files read: each a session-scoped fixture that runs its jobs to
their end on a pool of its own (``shared_pools``), closes the pool and returns what its tests
assert on, so that a run several tests check starts its trainers once. The fixtures are
registered for tests/infra/batch_nodes by its conftest.py."""

from __future__ import annotations

import io
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from azure.batch import BatchClient
from azure.core.credentials import AccessToken

from dt_commands.jobs.keep_out import keep_out
from dt_commands.jobs.logs import logs
from infra.job_spec import JobSpec
from infra.settings.tracking import TrackingSettings
from tests.batch_emulator.batch_api import EmulatedBatchApi, NodeScheduling
from tests.batch_emulator.cluster import Cluster
from tests.batch_emulator.fixtures import NODES_EMPTY_SECONDS, Stack, new_cluster
from tests.batch_emulator.job_run import JobRun
from tests.batch_emulator.jobs import (
    RUN_SECONDS,
    TINY,
    booted,
    checkpoint_steps,
    current_attempt,
    describe,
    folder_logs,
    in_built_image,
    make_spec,
    metrics,
    run_folder,
    submit,
    wait_for,
    worker_pids,
)
from tests.batch_emulator.nfs_view import NFS_VIEW_LONG_SECONDS, NFS_VIEW_SECONDS
from tests.batch_emulator.node import Node
from tests.batch_emulator.storage import Storage, blob
from tests.batch_emulator.vnet import VNet
from tests.support.mlflow_server import mlflow_server, store_uri
from tests.support.process_tree import fail_if_any_left

# The staged dataset's trainer settings (dataset_prefix: 3 classes of 24 px images).
SHARDS = {
    "model": "tiny", "num_classes": 3, "image_size": 16, "batch_size": 2, "warmup_epochs": 1,
    "loader_workers": 0, "log_every": 1,
}  # fmt: skip


class SharedPools:
    """Pools of emulated nodes for runs that several tests read. Each is made and booted as
    ``make_cluster`` makes one (the checkpoints container emptied first), inside a block that
    closes it at its end and checks that it left the session's node namespaces empty, as
    ``make_cluster`` does after a test: the next test (or shared run) gets the nodes. Its folders
    (the run folder on its NFS export, every node's task files) stay for the tests to read until
    the session ends; kept for inspection when a test failed."""

    def __init__(self, vnet: VNet, storage: Storage) -> None:
        self.vnet, self.storage = vnet, storage
        self.bases: list[Path] = []

    @contextmanager
    def make_cluster(self) -> Iterator[Callable[..., Cluster]]:
        """A ``make_cluster`` (without its fault options) whose pools close when the block ends."""
        made: list[Cluster] = []

        def make(stack: Stack, **options: Any) -> Cluster:
            cluster, base = new_cluster(self.vnet, self.storage, stack, **options)
            self.bases.append(base)
            made.append(cluster)
            cluster.boot()
            return cluster

        try:
            yield make
        finally:
            for cluster in made:
                cluster.close()
            fail_if_any_left(self.vnet.node_processes, NODES_EMPTY_SECONDS,
                             "on emulated nodes outlived their cluster")  # fmt: skip


@pytest.fixture(scope="session")
def shared_pools(vnet, storage, request) -> Iterator[SharedPools]:
    pools = SharedPools(vnet, storage)
    failed_before = request.session.testsfailed
    yield pools
    for base in pools.bases:
        if request.session.testsfailed == failed_before:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"emulated nodes of a shared run kept for inspection: {base}")


# --- two-node runs that complete, under each reading of what Azure leaves open ------------------
@dataclass(frozen=True)
class Readings:
    """A finished run's pool: its container lifecycle, data, reading of the "Shared" bind mount
    (SHARED_READINGS in containers.py) and of where the primary's coordination output goes
    (COORDINATION_OUTPUTS)."""

    lifecycle: str
    data: str  # "synthetic", or "shards": the staged dataset (dataset_prefix)
    shared: str
    coordination_output: str


# Both container lifecycles, each with a full run: the synthetic data under the stricter one, the
# staged dataset under the other, and under both readings of the "Shared" bind mount and of where
# the primary's coordination output goes (each reading is a pool's: one run per pool).
READINGS = {
    "kill": Readings("kill", "synthetic", "node", "apart"),
    "survive-shared-node": Readings("survive", "shards", "node", "together"),
    "survive-shared-task": Readings("survive", "shards", "task", "apart"),
}


class _Token:
    def get_token(self, *scopes, **kwargs):
        return AccessToken("operator-token", 4102444800)


class Printed(io.StringIO):
    """What ``dt-jobs logs`` printed, each line with whether the application command had
    started."""

    def __init__(self, run: JobRun) -> None:
        super().__init__()
        self.run = run
        self.lines: list[tuple[bool, str]] = []

    def write(self, text: str) -> int:
        started = self.run.application is not None
        self.lines += [(started, line) for line in text.splitlines()]
        return super().write(text)


@dataclass
class FinishedRun:
    """A two-node job (6 steps) run to its end on a pool of its own, now closed, followed by
    ``dt-jobs logs`` while it ran, and what it left where the tests look."""

    readings: Readings
    cluster: Cluster
    run: JobRun
    spec: JobSpec
    folder: Path  # the run folder on the pool's NFS export
    dataset_prefix: str  # "" for synthetic data
    ended_in_time: bool  # the run ended within RUN_SECONDS (and no node's preparation failed)
    uploaded: dict[str, str]  # the logs container's files of the job by name, as the run left them
    results: list[str]  # the outputs container's blobs of the job, under the job's id
    printed: Printed  # what `dt-jobs logs` printed while it followed the job
    follow_ended: list[int] = field(default_factory=list)  # its exit code, once it returned
    follow_alive: bool = False  # still polling 60 s after the run ended


def uploaded(vnet: VNet, storage: Storage, spec: JobSpec) -> dict[str, str]:
    """The job's files in the logs container, by file name."""
    names = blob(vnet, storage, "list", container="logs", prefix=f"{spec.job_id}/")
    return {
        name.rsplit("/", 1)[1]: blob(vnet, storage, "download", container="logs", blob=name)
        for name in names
    }


def _finished_run(
    pools: SharedPools,
    stack: Stack,
    folder: Path,
    name: str,
    image_root: Path,
    dataset_prefix: str = "",
) -> FinishedRun:
    readings = READINGS[name]
    vnet, storage = pools.vnet, pools.storage
    # The stricter lifecycle's run also takes the long NFS delays: a report that read the other
    # node's outcome before it could be in its view fails there first.
    bound = NFS_VIEW_LONG_SECONDS if readings.lifecycle == "kill" else NFS_VIEW_SECONDS
    if readings.data == "synthetic":
        args, prefix = {**TINY, "max_steps": 6, "epochs": 9}, ""
    else:
        args, prefix = {**SHARDS, "max_steps": 6, "epochs": 9}, dataset_prefix
    with pools.make_cluster() as make_cluster:
        # In the image `make image` built: its Python, packages and trainer, as on a node.
        cluster = booted(make_cluster, stack, lifecycle=readings.lifecycle,
                         shared=readings.shared, nfs_view=(0, bound),
                         coordination_output=readings.coordination_output,
                         image_root=image_root)  # fmt: skip
        spec = make_spec(stack, storage, trainer=args, dataset_prefix=prefix)
        run = submit(cluster, spec)
        # `dt-jobs logs` follows the job from its submission, as an operator would.
        api = EmulatedBatchApi(folder / "batch-api", cluster, run)
        try:
            client = BatchClient(api.url, _Token(), connection_verify=str(api.ca_path))
            printed, ended = Printed(run), []
            options = {"file_name": "stderr.txt", "poll_seconds": 0.2}
            job = {"job_id": spec.job_id}
            follow = threading.Thread(
                target=lambda: ended.append(logs(client, job, printed, **options))
            )
            follow.start()
            # A node whose preparation failed never gets the task: with two nodes the job would
            # wait forever, so that is a failure now.
            wait_for(lambda: run.finished.is_set() or run.prep_failed(), RUN_SECONDS,
                     "the run's end", cluster, run)  # fmt: skip
            ended_in_time = not run.prep_failed() and run.wait(RUN_SECONDS)
            follow.join(60)  # it polls until it reads the task completed
            alive = follow.is_alive()
        finally:
            api.close()
        # The job id is the same for the same settings: its blobs are read now, before another
        # run of the session uploads under it.
        results = blob(vnet, storage, "list", container="outputs", prefix=f"{spec.job_id}/")
        return FinishedRun(
            readings=readings, cluster=cluster, run=run, spec=spec,
            folder=run_folder(cluster, spec), dataset_prefix=prefix, ended_in_time=ended_in_time,
            uploaded=uploaded(vnet, storage, spec),
            results=[name.removeprefix(f"{spec.job_id}/") for name in results],
            printed=printed, follow_ended=ended, follow_alive=alive,
        )  # fmt: skip


@pytest.fixture(scope="session")
def run_under_kill(shared_pools, cpu_stack, tmp_path_factory, built_image) -> FinishedRun:
    """The two-node run under the stricter container lifecycle (``READINGS["kill"]``): read by
    test_training_job.py's test_two_node_run_completes_...[kill] and test_job_logs.py's
    test_logs_follow_every_nodes_live_output[apart]."""
    folder = tmp_path_factory.mktemp("kill")
    return _finished_run(shared_pools, cpu_stack, folder, "kill", built_image)


@pytest.fixture(scope="session")
def run_under_survive_shared_node(
    shared_pools, cpu_stack, tmp_path_factory, dataset_prefix, built_image
) -> FinishedRun:
    """The two-node run of ``READINGS["survive-shared-node"]``: read by test_training_job.py's
    test_two_node_run_completes_...[survive-shared-node] and test_job_logs.py's
    test_logs_follow_every_nodes_live_output[together]."""
    folder = tmp_path_factory.mktemp("survive-shared-node")
    return _finished_run(
        shared_pools, cpu_stack, folder, "survive-shared-node", built_image, dataset_prefix
    )


@pytest.fixture(scope="session")
def run_under_survive_shared_task(
    shared_pools, cpu_stack, tmp_path_factory, dataset_prefix, built_image
) -> FinishedRun:
    """The two-node run of ``READINGS["survive-shared-task"]``: read by test_training_job.py's
    test_two_node_run_completes_...[survive-shared-task]."""
    folder = tmp_path_factory.mktemp("survive-shared-task")
    return _finished_run(
        shared_pools, cpu_stack, folder, "survive-shared-task", built_image, dataset_prefix
    )


# Each run's fixture, by the name of its readings (test_training_job.py).
FINISHED_RUN_FIXTURES = {
    "kill": "run_under_kill",
    "survive-shared-node": "run_under_survive_shared_node",
    "survive-shared-task": "run_under_survive_shared_task",
}
# The fixture of a run above under each reading of the coordination output (test_job_logs.py).
RUN_UNDER_COORDINATION_OUTPUT = {
    "apart": "run_under_kill",
    "together": "run_under_survive_shared_node",
}


# --- a failed try retried on other nodes ----------------------------------------------------------
def trains(folder: Path, after_attempt: str | None, metrics_before: int):
    """A condition: a try later than ``after_attempt`` runs and has logged a step."""

    def condition() -> bool:
        try:
            attempt = current_attempt(folder)
        except (OSError, ValueError):
            return False
        return attempt != after_attempt and len(metrics(folder)) > metrics_before

    return condition


def _resumed_after(folder: Path, after_attempt: str) -> bool:
    """Whether a try later than ``after_attempt`` logged that it resumed."""
    try:
        attempt = current_attempt(folder)
    except (OSError, ValueError):
        return False
    return attempt != after_attempt and "resumed from" in folder_logs(folder, attempt)


@dataclass
class RetriedRun:
    """A run whose try failed (a worker killed on one node), retried on other nodes, then
    terminated; and the job's next run once the operator kept that node out."""

    cluster: Cluster
    run: JobRun
    spec: JobSpec  # the job's inputs, the same for the run and the rerun
    folder: Path
    dataset_prefix: str
    sick: Node  # the node whose worker was killed
    old_master: Node  # the first try's master
    spare: Node  # the node the first try did not use
    spare_prepared_first: int | None  # its preparation's exit code while the first try ran
    first_attempt: str  # the first try's attempt (its logs' folder)
    workers_in_image: bool  # the sick node's workers ran in the built image
    failed_after: float  # seconds from the worker's kill to the first try's failure
    reports: list[str]  # the primary's stdout.txt as each try of the run ended
    retry_attempt: str  # the retry's attempt
    placed: tuple[set[int], int | None]  # the retry's nodes and master, once it trained
    newest_before_terminate: int  # the newest checkpoint's step just before the terminate
    ended_after_terminate: bool  # the run ended within 60 s of the terminate (stop)
    keep_out_code: int  # `dt-jobs keep-out` of the sick node: its exit code and output
    keep_out_output: str
    again: JobRun  # the job's next run, ended once it resumed
    again_nodes: list[Node]  # its nodes, once it ran
    again_attempt: str  # its attempt, once it resumed
    again_ended: bool  # it ended within 60 s of its terminate (kill)
    # What the job's rank 0s tracked in MLflow (the stack's trackingUri, a server in the VNet):
    # every run of its experiment, read from the server's store once it stopped; the loss's
    # steps in the first of them; the train steps of metrics.jsonl once the retry ended.
    tracked: list[Any]
    tracked_loss_steps: set[int]
    train_steps_through_retry: set[int]


@contextmanager
def tracking_server(vnet: VNet, folder: Path) -> Iterator[str]:
    """An MLflow tracking server in the VNet, as a stack's trackingUri names one: on the
    storage endpoint's address in the switch's namespace, which every node reaches."""
    inside = vnet.exec_prefix(vnet.switch) if vnet.isolated else []
    with mlflow_server(folder, vnet.storage_ip, 5000 if inside else 0, inside) as uri:
        yield uri


def _tracked(folder: Path, experiment: str) -> tuple[list[Any], set[int]]:
    """The experiment's runs in the stopped server's store, and the first one's loss steps."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store_uri(folder))
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id]) if found is not None else []
    steps = (
        {m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")} if runs else set()
    )
    return runs, steps


@pytest.fixture(scope="session")
def retried_elsewhere_then_kept_out(
    shared_pools, storage, cpu_stack, dataset_prefix, built_image, vnet, tmp_path_factory
) -> RetriedRun:
    """Three nodes, the staged dataset, a long run checkpointing every two steps; Batch may
    retry a task on other nodes (tests/batch_emulator/placement.py, ``move``). A worker on the
    subtask's node dies: the try fails, Batch retries it without that node, on the spare and the
    old master, whose primary is the spare. Once the retry trained, a terminate (``stop``); then
    the operator keeps the node out (``dt-jobs keep-out``) and runs the job again (``pulumi up
    --replace``), until it resumed. The stack tracks its runs in MLflow (trackingUri: a server
    in the VNet), read once the server stopped. Read by test_training_job.py's
    test_a_killed_worker_fails_the_try_the_retry_resumes_and_a_terminate_checkpoints_all_ranks
    and test_a_retry_on_other_nodes_with_another_master_stages_again_and_resumes, and
    test_a_retry_on_another_node_and_the_rerun_go_on_in_the_jobs_one_mlflow_run, and
    test_sick_nodes.py's test_a_failed_rank_names_its_node_and_a_kept_out_node_gets_no_more_tries.
    """
    # The primary's output as each try ends (a later try on the same node writes it again).
    reports: list[str] = []
    original = JobRun._try

    def keep_the_report(self, attempt, instances):
        result = original(self, attempt, instances)
        path = self.task_dir(self.master) / "stdout.txt"
        reports.append(path.read_text() if path.exists() else "")
        return result

    mlflow_folder = tmp_path_factory.mktemp("mlflow")
    stack_name = cpu_stack.job_props["stack"]
    with (
        pytest.MonkeyPatch.context() as patch,
        tracking_server(vnet, mlflow_folder) as tracking_uri,
        shared_pools.make_cluster() as make_cluster,
    ):
        patch.setattr(JobRun, "_try", keep_the_report)
        cluster = booted(make_cluster, cpu_stack, nodes=3, lifecycle="kill", placement="move",
                         image_root=built_image)  # fmt: skip
        args = {**SHARDS, "max_steps": 4000, "epochs": 4000, "checkpoint_every": 2}
        tracking = TrackingSettings(uri=tracking_uri).environment(stack_name)
        spec = make_spec(cpu_stack, storage, trainer=args, dataset_prefix=dataset_prefix,
                         tracking=tracking)  # fmt: skip
        run = submit(cluster, spec)
        folder = run_folder(cluster, spec)
        wait_for(lambda: checkpoint_steps(folder), RUN_SECONDS, "a checkpoint", cluster, run)
        first, old_master = list(run.nodes), run.master
        assert old_master is not None
        (spare,) = [n for n in cluster.nodes if n not in first]
        spare_prepared_first = run.prep_exit.get(spare.index)
        first_attempt = current_attempt(folder)

        # A worker on the non-primary node dies: the try fails, every node's part of it stops
        # (batch-mpi.md: a subtask failure fails the task) and Batch retries it without that node.
        sick = next(n for n in first if n is not old_master)
        run.leave_out = sick
        workers = worker_pids(cluster, run, sick.index)
        assert workers, describe(cluster, run)
        workers_in_image = all(in_built_image(pid) for pid in workers)
        killed_at = time.monotonic()
        os.kill(workers[0], signal.SIGKILL)
        wait_for(lambda: run.tries, 60, "the try's failure", cluster, run)
        failed_after = time.monotonic() - killed_at

        # The retry trains (at least two steps more than the failed try logged).
        rows = len(metrics(folder))
        wait_for(trains(folder, first_attempt, rows), RUN_SECONDS, "retry steps", cluster, run)
        wait_for(lambda: len(metrics(folder)) > rows + 1, RUN_SECONDS, "retry steps", cluster, run)
        placed = ({n.index for n in run.nodes}, run.master and run.master.index)

        # A terminate, which reaches every rank.
        newest = checkpoint_steps(folder)[0]
        retry_attempt = current_attempt(folder)
        run.terminate()
        ended = run.wait(60)
        through_retry = {r["step"] for r in metrics(folder) if r.get("kind") == "train"}

        # The operator keeps the node out and runs the job again.
        out = io.StringIO()
        code = keep_out(NodeScheduling(cluster), cluster.pool.pool_id, [sick.id], False, out)
        again = submit(cluster, make_spec(cpu_stack, storage, trainer=args,
                                          dataset_prefix=dataset_prefix,
                                          tracking=tracking))  # fmt: skip
        wait_for(lambda: again.state == "running", RUN_SECONDS, "the rerun's start", cluster, again)
        again_nodes = list(again.nodes)
        # The rerun's own attempt (the retry's logs say "resumed from" too).
        wait_for(lambda: _resumed_after(folder, retry_attempt), RUN_SECONDS,
                 "the rerun's resume", cluster, again)  # fmt: skip
        again_attempt = current_attempt(folder)
        again.terminate("kill")  # only ends the run: no grace to wait out
        again_ended = again.wait(60)
    tracked, loss_steps = _tracked(mlflow_folder, stack_name)
    return RetriedRun(
        cluster=cluster, run=run, spec=spec, folder=folder, dataset_prefix=dataset_prefix,
        sick=sick,
        old_master=old_master, spare=spare, spare_prepared_first=spare_prepared_first,
        first_attempt=first_attempt, workers_in_image=workers_in_image,
        failed_after=failed_after, reports=reports,
        retry_attempt=retry_attempt, placed=placed, newest_before_terminate=newest,
        ended_after_terminate=ended, keep_out_code=code, keep_out_output=out.getvalue(),
        again=again, again_nodes=again_nodes, again_attempt=again_attempt,
        again_ended=again_ended, tracked=tracked, tracked_loss_steps=loss_steps,
        train_steps_through_retry=through_retry,
    )  # fmt: skip
