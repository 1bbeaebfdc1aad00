"""``dt-jobs fetch --register`` and ``--init-from models:/``: a finished run's model, its results
logged by the trainer's own tracking (trainer.outputs.tracking) to a real MLflow server on
127.0.0.1 and uploaded to Azurite, registered with its lineage; then a fresh model started from
the registered version, as the trainer's --init-from reads it; and what each refuses."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from dt_commands.jobs import main as dt_jobs
from tests.dt_commands.jobs.test_fetch import JOB_ID, outputs  # noqa: F401 - the fixture
from tests.support.mlflow_server import mlflow_server
from trainer.checkpoints import init_from
from trainer.models.build import build_model
from trainer.outputs.tracking import Tracking

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.fixture
def tracked(server, outputs, tmp_path, monkeypatch):  # noqa: F811 - the fixture
    """The job's run as its trainer made it: settings as params, results at step 6 logged."""
    _, local, stack = outputs
    monkeypatch.setenv("AZ_BATCH_JOB_ID", JOB_ID)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "vision")
    settings = {"model": "tiny", "num_classes": 5, "data": "synthetic"}
    run = Tracking.start(server, str(tmp_path / "run"), settings)
    run.finish(local, "max_steps", 6)
    text = stack.read_text().replace('{"jobs"', f'{{"azureml_tracking_uri": "{server}", "jobs"')
    text = text.replace('"jobs"', '"image_ref": "acr.io/trainer:7", "jobs"', 1)
    stack.write_text(text)
    return run.run_id, stack


def _fetch(stack, *more):
    return dt_jobs.main(["fetch", "--stack", "dev", "--outputs-file", str(stack), *more])


def test_a_fetched_runs_model_is_registered_with_its_lineage_and_a_run_starts_from_it(
    server, tracked, tmp_path, capsys, monkeypatch
):
    run_id, stack = tracked
    assert _fetch(stack, "--to", str(tmp_path / "got"), "--register", "resnet-demo") == 0
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith(f"registered model resnet-demo version 1 from run {run_id} ")
    assert said.endswith("--init-from models:/resnet-demo/1")
    version = MlflowClient(server).get_model_version("resnet-demo", "1")
    assert version.run_id == run_id
    assert version.source == f"runs:/{run_id}/results/step-000000006"
    assert version.tags == {
        "dt.job": JOB_ID,
        "dt.image": "acr.io/trainer:7",
        "dt.data": "data=synthetic",
        "dt.results": version.tags["dt.results"],
    } and version.tags["dt.results"].endswith(f"/{JOB_ID}/")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    model = build_model("tiny", 5)
    line = init_from.apply(model, "models:/resnet-demo/1", strict=True)
    assert line.startswith("init_from=models:/resnet-demo/1: started from ")
    assert "(safetensors)" in line


def test_register_without_a_workspace_is_one_line_before_anything_is_fetched(
    outputs,  # noqa: F811 - the fixture
    tmp_path,
    capsys,
):
    _, _, stack = outputs
    dest = tmp_path / "got"
    with pytest.raises(SystemExit) as refused:
        _fetch(stack, "--to", str(dest), "--register", "resnet-demo")
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: stack=dev: --register needs the stack's AzureML workspace")
    assert not dest.exists()


def test_init_from_a_registered_model_says_what_is_missing_in_one_line(server, monkeypatch):
    model = build_model("tiny", 5)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(init_from.InitError) as caught:
        init_from.apply(model, "models:/resnet-demo/1", strict=True)
    assert caught.value.exit_code == 2 and "MLFLOW_TRACKING_URI is not set" in str(caught.value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    with pytest.raises(init_from.InitError) as caught:
        init_from.apply(model, "models:/no-such-model/3", strict=True)
    assert caught.value.exit_code == 2 and "check the name and version" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_models_uri_of_another_form_is_refused_with_the_settings():
    from trainer.common.errors import ConfigError
    from trainer.settings.train_config import TrainConfig

    with pytest.raises(ConfigError) as caught:
        TrainConfig.from_mapping({"init_from": "models:/resnet-demo"})
    assert "give a registered model's version as models:/<name>/<version>" in str(caught.value)
    assert TrainConfig.from_mapping({"init_from": "models:/resnet-demo@champion"}).init_from
