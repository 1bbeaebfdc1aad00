"""A run tracked in an AzureML workspace (an ``azureml://`` MLFLOW_TRACKING_URI) through the
azureml-mlflow plugin, as a Batch node's trainer does it: its managed identity's ARM token, the
workspace's MLflow API and run history, the artifacts written to the workspace's storage (a fake
workspace in front of a real MLflow server and Azurite: tests/support/fake_azureml.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.support.fake_azureml import FakeAzureML
from tests.support.fake_imds import IDENTITY
from tests.support.mlflow_server import mlflow_server

REPO = Path(__file__).resolve().parents[3]
EXPERIMENT = "dev"


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> str:
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def _workspace(
    tmp_path: Path, backend: str, storage, writers: set[str], arriving_after: int = 0
) -> FakeAzureML:
    return FakeAzureML(tmp_path / "workspace-tls", backend, storage, writers, arriving_after)


def _train(tmp_path: Path, env: dict[str, str], job: str, steps: int):
    """``python -m trainer`` as the Batch task starts it: the job's id and the environment
    the stack gives the task (its identity's client id, the tracking URI and experiment)."""
    command = [
        sys.executable, "-m", "trainer", "--model", "tiny", "--num-classes", "5",
        "--image-size", "16", "--batch-size", "8", "--synthetic-size", "64",
        "--synthetic-pool", "32", "--epochs", "3", "--warmup-epochs", "1", "--lr", "0.05",
        "--max-steps", str(steps), "--log-every", "1", "--backend", "local",
        "--output-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    task_env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "AZ_BATCH_JOB_ID": job,
        "MLFLOW_EXPERIMENT_NAME": EXPERIMENT,
        **env,
    }
    return subprocess.run(
        command, cwd=REPO, env=task_env, capture_output=True, text=True, timeout=600
    )


def _runs(backend: str, job: str) -> list:
    client = MlflowClient(backend)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    return client.search_runs([experiment.experiment_id], f"attributes.run_name = '{job}'")


def test_a_nodes_run_goes_to_the_workspace_with_its_model_and_a_rerun_resumes_it(
    tmp_path, backend, azurite_entra
):
    workspace = _workspace(tmp_path, backend, azurite_entra, writers={IDENTITY})
    job = f"dev-default-{time.monotonic_ns()}"
    try:
        env = {**azurite_entra.env(), **workspace.env(tmp_path / "ca.pem")}
        first = _train(tmp_path, env, job, steps=2)
        assert first.returncode == 0, first.stderr[-3000:]
        second = _train(tmp_path, env, job, steps=4)
        assert second.returncode == 0, second.stderr[-3000:]
        # A rerun of the ended job (a retry after rank 0 finished, a new image): its results
        # were logged at that step already, and the run ends FINISHED again.
        third = _train(tmp_path, env, job, steps=4)
        assert third.returncode == 0, third.stderr[-3000:]
    finally:
        workspace.close()
    (found,) = _runs(backend, job)
    run_id = found.info.run_id
    said = first.stderr + second.stderr + third.stderr
    assert "MLflow tracking stopped" not in said, said[-3000:]
    assert found.info.status == "FINISHED" and found.data.params["model"] == "tiny"
    studio = f"https://ml.azure.com/runs/{run_id}?wsid={workspace.scope}"
    assert f"MLflow: new run {run_id} {studio}\n" in first.stdout, first.stdout
    assert f"MLflow: resumed run {run_id} {studio}\n" in second.stdout
    history = MlflowClient(backend).get_metric_history(run_id, "loss")
    assert [m.step for m in history] == [1, 2, 3, 4]
    # The results as AzureML keeps a run's artifacts: in the workspace's storage, by run, each
    # end's under its step (an artifact is never overwritten there).
    folder = f"ExperimentRun/dcid.{run_id}/results/"
    blobs = {b.name.removeprefix(folder) for b in workspace.artifacts.list_blobs(folder)}
    assert {"step-000000002/model.safetensors", "step-000000004/model.safetensors"} <= blobs
    assert workspace.refusals == []
    assert "Traceback" not in said
    # Neither the plugin's nor the SDK's request logging: rank 0's log is the trainer's.
    assert "ManagedIdentityCredential" not in said and "Parsing tracking uri" not in said


def test_in_an_azureml_job_the_trainer_logs_into_the_jobs_own_run(tmp_path, backend, azurite_entra):
    """An AzureML job is a run: its runtime gives MLFLOW_RUN_ID with the workspace's URI. The
    trainer's metrics, settings and results go to that run, through the plugin, and the job
    (not the trainer) ends it."""
    workspace = _workspace(tmp_path, backend, azurite_entra, writers={IDENTITY})
    job = f"azureml-job-{time.monotonic_ns()}"
    client = MlflowClient(backend)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
    given = client.create_run(experiment_id, run_name="the-jobs-run").info.run_id
    try:
        env = {**azurite_entra.env(), **workspace.env(tmp_path / "ca.pem")}
        done = _train(tmp_path, {**env, "MLFLOW_RUN_ID": given}, job, steps=2)
    finally:
        workspace.close()
    assert done.returncode == 0, done.stderr[-3000:]
    studio = f"https://ml.azure.com/runs/{given}?wsid={workspace.scope}"
    assert f"MLflow: the environment's (MLFLOW_RUN_ID) run {given} {studio}\n" in done.stdout
    assert _runs(backend, job) == []  # no run of the trainer's own
    run = client.get_run(given)
    assert run.info.status == "RUNNING" and run.data.params["model"] == "tiny"
    assert [m.step for m in client.get_metric_history(given, "loss")] == [1, 2]
    folder = f"ExperimentRun/dcid.{given}/results/"
    blobs = {b.name.removeprefix(folder) for b in workspace.artifacts.list_blobs(folder)}
    assert "step-000000002/model.safetensors" in blobs
    assert workspace.refusals == [] and "Traceback" not in done.stderr


def _in_this_process(monkeypatch, tmp_path, storage, workspace, minutes: float) -> None:
    """This process as a node's rank 0: the identity, the workspace's URI, trust in both fakes'
    certificates, and how long it waits for a role to arrive."""
    from tests.conftest import act_as_identity_of
    from trainer.outputs import tracking

    act_as_identity_of(storage, monkeypatch)
    for name, value in workspace.env(tmp_path / "ca.pem").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
    monkeypatch.setenv("AZ_BATCH_JOB_ID", f"dev-default-{time.monotonic_ns()}")
    monkeypatch.setattr(tracking, "GRANT_MINUTES", minutes)


def test_a_role_that_has_not_arrived_is_waited_for_and_then_the_run_starts(
    tmp_path, backend, azurite_entra, monkeypatch, capsys
):
    from trainer.outputs.tracking import Tracking

    workspace = _workspace(tmp_path, backend, azurite_entra, {IDENTITY}, arriving_after=2)
    try:
        _in_this_process(monkeypatch, tmp_path, azurite_entra, workspace, minutes=1)
        run = Tracking.start(workspace.tracking_uri, str(tmp_path / "run"), {"lr": 0.1})
        run.finish(None, "signal", 0)
    finally:
        workspace.close()
    assert workspace.refusals[:2] == ["AuthorizationFailed"] * 2
    (found,) = _runs(backend, os.environ["AZ_BATCH_JOB_ID"])
    assert found.info.run_id == run.run_id and found.data.params == {"lr": "0.1"}
    waits = [line for line in capsys.readouterr().out.splitlines() if "refuses the run" in line]
    assert waits and waits[0].startswith(
        f"MLFLOW_TRACKING_URI={workspace.tracking_uri}: the workspace refuses the run (403 "
        f"AuthorizationFailed): identity {IDENTITY} lacks MLflow writer (MLflow's actions) on "
        "the workspace yet"
    ), waits


def test_an_identity_without_the_mlflow_role_stops_the_run_in_one_line_before_training(
    tmp_path, backend, azurite_entra, monkeypatch
):
    from trainer.common.errors import ConfigError
    from trainer.outputs.tracking import Tracking

    workspace = _workspace(tmp_path, backend, azurite_entra, writers=set())
    try:
        _in_this_process(monkeypatch, tmp_path, azurite_entra, workspace, minutes=0.02)
        with pytest.raises(ConfigError) as refused:
            Tracking.start(workspace.tracking_uri, str(tmp_path / "run"), {"lr": 0.1})
    finally:
        workspace.close()
    line = str(refused.value)
    assert "\n" not in line and line == (
        f"MLFLOW_TRACKING_URI={workspace.tracking_uri}: the workspace still refuses the run "
        f"(403 AuthorizationFailed) after 0.02 min: identity {IDENTITY} lacks MLflow writer "
        "(MLflow's actions) on the workspace; assign it (the stack grants it to the nodes' "
        "identity), or wait for the assignment to propagate (up to 30 min), then rerun"
    )
    assert set(workspace.refusals) == {"AuthorizationFailed"}
    # Nothing reached the store: no run of the job.
    experiment = MlflowClient(backend).get_experiment_by_name(EXPERIMENT)
    assert experiment is None or not _runs(backend, os.environ["AZ_BATCH_JOB_ID"])
