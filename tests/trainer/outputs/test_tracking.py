"""Rank 0's MLflow run (trainer.outputs.tracking) against a real MLflow tracking server on
127.0.0.1: what a run logs, that a resumed job goes on in its run, and what happens when the
server is not there or goes away."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import tiny_config
from tests.support.mlflow_server import mlflow_server
from tests.support.ports import free_port
from tests.support.tcp_relay import relay
from trainer.common.errors import ConfigError
from trainer.engines.local import LocalDist
from trainer.outputs import tracking
from trainer.outputs.tracking import RUN_KEY_TAG, Tracking, run_identity
from trainer.settings.train_config import DEFAULTS
from trainer.training.run import train


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> str:
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.fixture
def job(monkeypatch, tmp_path) -> str:
    """A Batch job's id, as the task's environment gives it, whose run folder is ``tmp_path``
    (one per test); returns the run's key, the folder's absolute path."""
    monkeypatch.setenv("AZ_BATCH_JOB_ID", f"dev-default-{time.monotonic_ns()}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "tests")
    return str(tmp_path.absolute())


def _results(folder: Path) -> Path:
    results = folder / "results"
    results.mkdir(parents=True)
    (results / "model.safetensors").write_bytes(b"weights")
    (results / "evaluation.json").write_text('{"accuracy": 0.5}')
    return results


def _runs(uri: str, key: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tests")
    if experiment is None:
        return []
    return client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'"
    )


def test_a_run_is_named_after_its_job_with_its_settings_metrics_checkpoints_and_model(
    server, job, tmp_path
):
    settings = {"model": "resnet50", "lr": 0.1, "batch_size": 256, "lr_step_epochs": [30, 60]}
    run = Tracking.start(server, str(tmp_path), settings)
    assert not run.resumed
    run.metrics({"kind": "train", "step": 10, "epoch": 0, "loss": 2.5, "lr": 0.1,
                 "images_per_sec": 900.0})  # fmt: skip
    # The evaluation's record as the trainer logs it (trainer.training.steps.evaluate).
    run.metrics({"kind": "eval", "step": 20, "epoch": 1, "val_loss": 2.0, "val_accuracy": 0.25,
                 "val_samples": 64})  # fmt: skip
    run.metrics({"kind": "checkpoint", "step": 20, "stall_sec": 0.3})
    run.metrics({"kind": "gpu", "step": 20, "rank": 1, "power_w": 500.0})  # per rank: not sent
    run.finish(_results(tmp_path), "max_steps", 20)

    (found,) = _runs(server, job)
    assert found.info.run_name == os.environ["AZ_BATCH_JOB_ID"] and found.info.status == "FINISHED"
    assert found.data.params == {key: str(value) for key, value in settings.items()}
    assert found.data.tags["dt.stopped_by"] == "max_steps"
    assert found.data.tags["dt.batch_job"] == os.environ["AZ_BATCH_JOB_ID"]
    client = MlflowClient(server)
    history = {key: [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, key)]
               for key in found.data.metrics}  # fmt: skip
    assert history == {
        "loss": [(10, 2.5)], "lr": [(10, 0.1)], "images_per_sec": [(10, 900.0)],
        "val_loss": [(20, 2.0)], "val_accuracy": [(20, 0.25)], "val_samples": [(20, 64.0)],
        "checkpoint_stall_sec": [(20, 0.3)], "checkpoint_step": [(20, 20.0)],
    }  # fmt: skip
    folder = "results/step-000000020"
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id, folder)}
    assert artifacts == {f"{folder}/model.safetensors", f"{folder}/evaluation.json"}
    downloaded = Path(client.download_artifacts(found.info.run_id, f"{folder}/model.safetensors",
                                                str(tmp_path / "down")))  # fmt: skip
    assert downloaded.read_bytes() == b"weights"


def test_a_resumed_job_goes_on_in_its_run_and_a_paused_one_is_killed_until_then(
    server, job, tmp_path, monkeypatch
):
    first = Tracking.start(server, str(tmp_path), {"lr": 0.1})
    first.metrics({"kind": "train", "step": 5, "loss": 3.0})
    first.finish(None, "signal", 5)  # a SIGTERM: no results, the job resumes later
    (paused,) = _runs(server, job)
    assert paused.info.status == "KILLED" and paused.data.tags["dt.stopped_by"] == "signal"

    # A replaced job (another Batch job id) resumes the same run folder, so the same run.
    monkeypatch.setenv("AZ_BATCH_JOB_ID", "dev-default-replaced")
    again = Tracking.start(server, str(tmp_path), {"lr": 0.1})
    assert again.resumed and again.run_id == first.run_id
    (running,) = _runs(server, job)
    assert running.info.status == "RUNNING"
    again.metrics({"kind": "train", "step": 10, "loss": 2.0})
    again.finish(_results(tmp_path), "max_steps", 10)
    (done,) = _runs(server, job)  # one run, not two
    assert done.data.tags["dt.batch_job"] == "dev-default-replaced"
    history = MlflowClient(server).get_metric_history(done.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(5, 3.0), (10, 2.0)]
    assert done.info.status == "FINISHED"


def test_only_rank_0_of_a_run_with_a_uri_tracks_and_a_run_that_fails_is_marked_failed(
    server, job, tmp_path, monkeypatch
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with tracking.tracked(str(tmp_path), {}, is_root=True) as run:
        assert run is None  # no URI: no tracking at all
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    with tracking.tracked(str(tmp_path), {}, is_root=False) as run:
        assert run is None  # the other ranks never track
    assert not _runs(server, job)
    with (
        pytest.raises(RuntimeError, match="a step"),
        tracking.tracked(str(tmp_path), {}, is_root=True) as run,
    ):
        assert run is not None
        raise RuntimeError("a step failed")
    (failed,) = _runs(server, job)
    assert failed.info.status == "FAILED"


def test_a_long_run_holds_a_bounded_number_of_writes_and_every_step_arrives(server, job, tmp_path):
    run = Tracking.start(server, str(tmp_path), {})
    for step in range(1, 201):
        run.metrics({"kind": "train", "step": step, "loss": 1.0 / step})
        assert len(run._pending) <= tracking.PENDING_WRITES
    run.finish(None, "run_steps", 200)
    (found,) = _runs(server, job)
    history = MlflowClient(server).get_metric_history(found.info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, 201))


def test_a_server_that_cannot_be_reached_is_one_line_before_anything_trains(
    job, tmp_path, monkeypatch
):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(ConfigError) as raised:
        Tracking.start(uri, str(tmp_path), {"lr": 0.1})
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"MLFLOW_TRACKING_URI={uri}: the MLflow tracking store cannot be")
    assert message.endswith("or unset MLFLOW_TRACKING_URI to train without tracking")
    # The trainer's own client defaults: a few retries, not MLflow's minutes of them.
    assert time.monotonic() - started < 60


def test_a_server_that_goes_away_mid_run_is_one_warning_and_the_run_goes_on(
    server, job, tmp_path, capsys
):
    """The server out of the run's reach after its start (its network cut): the steps and the
    end of the run go on, with one warning."""
    with relay(int(server.rsplit(":", 1)[1])) as path:
        run = Tracking.start(f"http://127.0.0.1:{path.port}", str(tmp_path), {"lr": 0.1})
        run.metrics({"kind": "train", "step": 1, "loss": 1.0})
        run._wait()
        path.cut()
        for step in range(2, 6):
            run.metrics({"kind": "train", "step": step, "loss": 1.0 / step})
        run.finish(_results(tmp_path), "max_steps", 5)  # never raises
    warnings = [line for line in capsys.readouterr().err.splitlines() if "MLflow" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("warning: MLflow tracking stopped (")
    assert warnings[0].endswith(
        "the run goes on, its metrics stay in metrics.jsonl and TensorBoard"
    )
    (found,) = _runs(server, job)  # what reached the server before the cut stays
    history = MlflowClient(server).get_metric_history(found.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.0)]


def test_a_run_is_named_after_its_job_and_keyed_by_where_its_checkpoints_live(
    tmp_path, monkeypatch
):
    folder = str(tmp_path / "runs" / "resnet")
    assert run_identity(folder, "", {}) == ("resnet", folder)
    assert run_identity(folder, "", {"AZ_BATCH_JOB_ID": "dev-resnet-0a1b2c3d4e"}) == (
        "dev-resnet-0a1b2c3d4e",
        folder,
    )
    monkeypatch.chdir(tmp_path)
    assert run_identity("runs/resnet", "", {}) == ("resnet", folder)
    # A job's checkpoints are mirrored: the mirror names the run wherever a node mounts the share.
    mirror = "https://data.blob.core.windows.net/checkpoints/dev/9fcc41bd9595/"
    assert run_identity("runs/resnet", mirror, {}) == ("resnet", mirror.rstrip("/"))


def test_the_trainer_logs_its_run_and_a_rerun_of_the_job_resumes_it(
    server, job, tmp_path, monkeypatch, capsys
):
    """The trainer itself (one process, the local backend): its settings, steps, checkpoints and
    results; the job's rerun resumes the checkpoint and the MLflow run with it."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    first = train(_config(tmp_path, max_steps=2, log_every=1), LocalDist())
    second = train(_config(tmp_path, max_steps=4, log_every=1), LocalDist())
    assert (first.step, second.start_step, second.step) == (2, 2, 4)
    (found,) = _runs(server, job)
    assert found.info.status == "FINISHED" and found.info.run_name == os.environ["AZ_BATCH_JOB_ID"]
    # Each invocation's log links the run's page, the same run twice.
    page = f"{server}/#/experiments/{found.info.experiment_id}/runs/{found.info.run_id}"
    printed = capsys.readouterr().out
    assert f"MLflow: new run {found.info.run_id} {page}\n" in printed, printed
    assert f"MLflow: resumed run {found.info.run_id} {page}\n" in printed, printed
    assert found.data.params["model"] == "tiny" and found.data.params["max_steps"] == "2"
    client = MlflowClient(server)
    loss = client.get_metric_history(found.info.run_id, "loss")
    assert [m.step for m in loss] == [1, 2, 3, 4]
    checkpoints = client.get_metric_history(found.info.run_id, "checkpoint_step")
    assert [m.value for m in checkpoints][-1] == 4.0
    # Each end's results under its step: the first invocation's are kept beside the second's.
    folders = {a.path for a in client.list_artifacts(found.info.run_id, "results")}
    assert folders == {"results/step-000000002", "results/step-000000004"}
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id, "results/step-000000004")}
    assert {"results/step-000000004/model.safetensors",
            "results/step-000000004/evaluation.json"} <= artifacts  # fmt: skip


def _config(output_dir: Path, **extra):
    return DEFAULTS.replace(**tiny_config(output_dir, **{"backend": "local", **extra}))


def test_the_run_the_environment_gives_is_logged_to_and_left_for_its_giver_to_end(
    server, job, tmp_path, monkeypatch
):
    """An AzureML job is a run: its runtime sets MLFLOW_RUN_ID with the tracking URI. Rank 0
    logs into that run (no run of its own), tags it with the run's key so a later job of the
    same run is found by it, and leaves ending it to the job."""
    client = MlflowClient(server)
    experiment = client.get_experiment_by_name("tests")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("tests")
    given = client.create_run(experiment_id, run_name="azureml-job").info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", given)
    run = Tracking.start(server, str(tmp_path), {"lr": 0.1})
    assert (run.run_id, run.resumed, run.owned) == (given, False, False)
    run.metrics({"kind": "train", "step": 5, "loss": 3.0})
    run.finish(_results(tmp_path), "max_steps", 5)

    (found,) = _runs(server, job)  # the given run, found by its key; none of the trainer's own
    assert found.info.run_id == given and found.info.run_name == "azureml-job"
    assert found.data.params == {"lr": "0.1"} and found.data.tags["dt.stopped_by"] == "max_steps"
    assert found.info.status == "RUNNING"  # the job ends it
    history = client.get_metric_history(given, "loss")
    assert [(m.step, m.value) for m in history] == [(5, 3.0)]
    assert {a.path for a in client.list_artifacts(given, "results")} == {"results/step-000000005"}

    again = Tracking.start(server, str(tmp_path), {"lr": 0.1})  # the settings are logged once
    assert again.resumed and again.run_id == given
    again.failed()
    assert client.get_run(given).info.status == "RUNNING"


def test_a_given_run_that_does_not_exist_is_one_line_naming_the_variable(
    server, job, tmp_path, monkeypatch
):
    monkeypatch.setenv("MLFLOW_RUN_ID", "0123456789abcdef0123456789abcdef")
    with pytest.raises(ConfigError) as caught:
        Tracking.start(server, str(tmp_path), {"lr": 0.1})
    line = str(caught.value)
    assert line.startswith(
        "MLFLOW_RUN_ID=0123456789abcdef0123456789abcdef: the run the environment gives cannot be "
        f"logged to at {server} ("
    ), line
    assert line.endswith("unset MLFLOW_RUN_ID to let the trainer find or make its run")
    assert "\n" not in line and not _runs(server, job)
