"""The stack's MLflow tracking (trackingUri, trackingExperiment): checked before anything is
declared, handed to every job's training task as MLflow's variables, a new job when changed."""

from __future__ import annotations

import azure.batch.models as batch_models
import pytest

from dt_commands.plan import evaluate, job_lines
from infra.batch import job_options, task_options
from infra.job_spec import JobSpec
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from tests.support.stacks import one, stack_values

SERVER = "http://10.20.3.4:5000"
JOB = "pulumi-python:dynamic:Resource"


def _plan(**changes):
    values = {**stack_values("dev"), **{f"gpu-cluster:{k}": v for k, v in changes.items()}}
    return evaluate("dev", values)


def _spec(plan) -> JobSpec:
    return JobSpec.from_props(one(plan, "pulumi-python:dynamic:Resource").inputs)


def _env(options) -> dict[str, str]:
    return {e.name: e.value for e in options.environment_settings or []}


def test_every_training_task_gets_the_server_and_the_stacks_experiment(dev_plan):
    plan = _plan(trackingUri=SERVER, datasetPrefix="imagenet")
    job = one(plan, "pulumi-python:dynamic:Resource")
    assert job.inputs["tracking"] == [
        ["MLFLOW_TRACKING_URI", SERVER],
        ["MLFLOW_EXPERIMENT_NAME", "dev"],
    ]
    spec = JobSpec.from_props(job.inputs)
    assert _env(task_options(spec)) == {
        "AZURE_CLIENT_ID": spec.node_identity_client_id,
        "MLFLOW_TRACKING_URI": SERVER,
        "MLFLOW_EXPERIMENT_NAME": "dev",
    }
    # Staging the data tracks nothing: only the training task's rank 0 logs.
    preparation = job_options(spec).job_preparation_task
    assert set(_env(preparation)) == {"AZURE_CLIENT_ID"}
    assert f"    tracking: MLflow at {SERVER}, experiment dev" in job_lines(plan)
    # Without the setting the task's environment is what it always was.
    assert _env(task_options(_spec(dev_plan))) == {
        "AZURE_CLIENT_ID": _spec(dev_plan).node_identity_client_id
    }


def test_a_new_server_is_a_new_job_that_resumes_the_same_run_folder(dev_plan):
    before = _spec(dev_plan)
    tracked = _spec(_plan(trackingUri=SERVER))
    elsewhere = _spec(_plan(trackingUri=SERVER, trackingExperiment="vision-sweeps"))
    assert len({before.job_id, tracked.job_id, elsewhere.job_id}) == 3
    assert before.checkpoint_path == tracked.checkpoint_path == elsewhere.checkpoint_path
    assert dict(elsewhere.tracking)["MLFLOW_EXPERIMENT_NAME"] == "vision-sweeps"


def test_batch_never_changes_an_environment_once_the_task_or_job_exists():
    # Why a new server is a new job. "Task - Update": only the task's constraints; "Job -
    # Update"/"Job - Patch": priority, constraints, poolInfo, ..., never the job's common
    # environment (Batch REST reference, read 2026-11-29). azure-batch's models say the same.
    def updatable(model) -> set[str]:
        return {
            k for k, v in vars(model).items() if "update" in (getattr(v, "_visibility", None) or [])
        }

    assert updatable(batch_models.BatchTask) == {"constraints"}
    assert "common_environment_settings" not in updatable(batch_models.BatchJob)
    assert "environment_settings" in vars(batch_models.BatchTask)


URI, EXPERIMENT = "trackingUri", "trackingExperiment"


@pytest.mark.parametrize(
    ("changes", "names", "fix"),
    [
        ({URI: "sqlite:///mlruns.db"}, "trackingUri='sqlite:///mlruns.db'", "each node's own"),
        ({URI: "10.20.3.4:5000"}, "trackingUri='10.20.3.4:5000'", "http(s)://<host>:<port>"),
        ({URI: "http://:5000"}, "trackingUri='http://:5000'", "http(s)://<host>:<port>"),
        ({URI: "http://mlflow:port"}, "trackingUri='http://mlflow:port': not a URL", "http(s)://"),
        (
            {URI: "azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/x"},
            "trackingUri='azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/x': not a "
            "workspace's tracking URI",
            "az ml workspace show --query mlflow_tracking_uri",
        ),
        (
            {EXPERIMENT: "vision"},
            "trackingExperiment='vision' without trackingUri or azuremlWorkspace",
            "azuremlWorkspace true",
        ),
        (
            {URI: SERVER, "azuremlWorkspace": True},
            f"trackingUri='{SERVER}' with azuremlWorkspace=true: the jobs track in one place",
            "remove trackingUri",
        ),
        ({URI: SERVER, EXPERIMENT: " vision"}, "trackingExperiment=' vision'", "spaces"),
        ({URI: SERVER, EXPERIMENT: "x" * 257}, "trackingExperiment='xxx", "256"),
    ],
)
def test_a_bad_tracking_value_is_one_line_naming_it_and_the_fix(schema, changes, names, fix):
    values = {**stack_values("dev"), **{f"gpu-cluster:{k}": v for k, v in changes.items()}}
    with pytest.raises(ConfigError) as raised:
        StackSettings.from_mapping("dev", values, schema)
    line = str(raised.value)
    assert line.startswith(names) and fix in line and "\n" not in line


def test_credentials_in_the_url_are_refused_without_showing_them(schema):
    values = {
        **stack_values("dev"),
        "gpu-cluster:trackingUri": "https://ops:hunter2@mlflow.corp:443",
    }
    with pytest.raises(ConfigError) as raised:
        StackSettings.from_mapping("dev", values, schema)
    line = str(raised.value)
    assert line.startswith("trackingUri='https://***@mlflow.corp:443': credentials in the URL")
    assert "hunter2" not in line and "ops" not in line
    # Even with a port that is not one, the line never shows them.
    values["gpu-cluster:trackingUri"] = "https://ops:hunter2@mlflow.corp:port"
    with pytest.raises(ConfigError) as raised:
        StackSettings.from_mapping("dev", values, schema)
    assert "hunter2" not in str(raised.value) and "credentials in the URL" in str(raised.value)


WORKSPACE_URI = (
    "azureml://westeurope.api.azureml.ms/mlflow/v1.0/subscriptions/"
    "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9/resourceGroups/rg-ml/providers/"
    "Microsoft.MachineLearningServices/workspaces/team-ml"
)


def test_a_teams_own_workspace_uri_is_taken_as_the_tracking_server():
    spec = _spec(_plan(trackingUri=WORKSPACE_URI, datasetPrefix="imagenet"))
    assert dict(spec.tracking) == {
        "MLFLOW_TRACKING_URI": WORKSPACE_URI,
        "MLFLOW_EXPERIMENT_NAME": "dev",
    }


def test_with_its_own_workspace_every_job_tracks_there_in_its_experiment():
    plan = _plan(azuremlWorkspace=True, trackingExperiment="vision", datasetPrefix="imagenet")
    workspace_uri = plan.outputs["azureml_tracking_uri"]
    assert workspace_uri.startswith("azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/")
    spec = _spec(plan)
    assert dict(spec.tracking) == {
        "MLFLOW_TRACKING_URI": workspace_uri,
        "MLFLOW_EXPERIMENT_NAME": "vision",
    }
    assert _env(task_options(spec))["MLFLOW_TRACKING_URI"] == workspace_uri
    # The plugin authenticates as the nodes' identity, whose client id the task already has.
    assert _env(task_options(spec))["AZURE_CLIENT_ID"] == spec.node_identity_client_id
    assert f"tracking: MLflow at {workspace_uri}, experiment vision" in "\n".join(job_lines(plan))


def test_a_preview_that_does_not_know_the_workspaces_uri_yet_replaces_no_running_job(
    monkeypatch,
):
    """azure-native previews a workspace's in-place update (a tag) with its inputs and only the
    outputs that never change, so the tracking URI a job gets is unknown then; the running job
    is neither replaced nor refused. The update's own diff, with the URI known, still compares
    it: a new URI is refused for the running job as any other change."""
    from pulumi.runtime.rpc import UNKNOWN

    from infra.job import JobError, TrainingJobProvider

    job = one(_plan(azuremlWorkspace=True, datasetPrefix="imagenet"), JOB).inputs
    olds = {**job, "state": "active", "job_id": "dev-default-0123456789"}
    monkeypatch.setattr(TrainingJobProvider, "_running_state", staticmethod(lambda *_: "active"))
    provider = TrainingJobProvider()
    unknown = [[name, UNKNOWN if name == "MLFLOW_TRACKING_URI" else value]
               for name, value in job["tracking"]]  # fmt: skip
    diff = provider.diff(olds["job_id"], olds, {**job, "tracking": unknown})
    assert diff.changes is False and not diff.replaces
    moved = [[name, WORKSPACE_URI if name == "MLFLOW_TRACKING_URI" else value]
             for name, value in job["tracking"]]  # fmt: skip
    with pytest.raises(JobError, match="would replace it \\(tracking\\)"):
        provider.diff(olds["job_id"], olds, {**job, "tracking": moved})
