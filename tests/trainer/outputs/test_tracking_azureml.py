"""A run tracked in an AzureML workspace (an ``azureml://`` MLFLOW_TRACKING_URI) through the
azureml-mlflow plugin, as a Batch node's trainer does it: its managed identity's ARM token, the
workspace's MLflow API and run history, the artifacts written to the workspace's storage (a fake
workspace in front of a real MLflow server and Azurite: tests/support/fake_azureml.py)."""

from __future__ import annotations

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


def _workspace(tmp_path: Path, backend: str, storage, writers: set[str]) -> FakeAzureML:
    return FakeAzureML(tmp_path / "workspace-tls", backend, storage, writers)


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


def test_an_identity_without_the_mlflow_role_stops_the_run_in_one_line_before_training(
    tmp_path, backend, azurite_entra
):
    workspace = _workspace(tmp_path, backend, azurite_entra, writers=set())
    try:
        env = {**azurite_entra.env(), **workspace.env(tmp_path / "ca.pem")}
        refused = _train(tmp_path, env, f"dev-default-{time.monotonic_ns()}", steps=2)
    finally:
        workspace.close()
    assert refused.returncode == 2, refused.stderr[-3000:]
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, refused.stderr[-3000:]
    assert errors[0].startswith(f"error: MLFLOW_TRACKING_URI={workspace.tracking_uri}: ")
    assert "AuthorizationFailed" in errors[0] or "403" in errors[0], errors[0]
    assert errors[0].endswith(
        f"grant {IDENTITY} MLflow's actions on the workspace (a stack with azuremlWorkspace "
        "gives its nodes the MLflow writer role; a new assignment takes minutes to arrive), or "
        "unset MLFLOW_TRACKING_URI to train without tracking"
    ), errors[0]
    assert "Traceback" not in refused.stderr
    assert "AuthorizationFailed" in workspace.refusals
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir()
    )
