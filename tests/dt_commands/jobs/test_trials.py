"""``dt-jobs trials`` against a real MLflow tracking server on 127.0.0.1 holding a sweep's run and
its trials as AzureML records them (how-to-track-experiments-mlflow.md, read 2026-11-29: the
trials are child runs, tagged ``mlflow.parentRunId``; AzureML's Canceled is MLflow's KILLED;
the trainer logs its settings as params and val_loss as a metric)."""

from __future__ import annotations

import json
import re

import pytest

from dt_commands.jobs.main import main
from tests.support.mlflow_server import mlflow_server
from tests.support.ports import free_port

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def _sweep(uri: str, trials: list[tuple[str, float | None, str]], cancelled: bool = False) -> str:
    """A sweep's run and its trials ((status, val_loss or None, lr), in that order); its id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("dev") or client.get_experiment(
        client.create_experiment("dev")
    )
    parent = client.create_run(experiment.experiment_id, run_name="dev-tune-0123456789")
    for status, loss, lr in trials:
        tags = {"mlflow.parentRunId": parent.info.run_id}
        run = client.create_run(experiment.experiment_id, tags=tags)
        client.log_param(run.info.run_id, "lr", lr)
        client.log_param(run.info.run_id, "batch_size", "64")
        if loss is not None:
            client.log_metric(run.info.run_id, "val_loss", loss + 1.0, step=1)
            client.log_metric(run.info.run_id, "val_loss", loss, step=2)  # the last one counts
        if status != "RUNNING":
            client.set_terminated(run.info.run_id, status)
    if cancelled:
        client.set_terminated(parent.info.run_id, "KILLED")
    return parent.info.run_id


def _outputs(tmp_path, uri: str, job_id: str, sweep: bool = True) -> list[str]:
    job = {"job_id": job_id, "node_count": 2}
    if sweep:
        job["sweep"] = {
            "objective": "val_loss",
            "goal": "minimize",
            "settings": ["lr", "batch_size"],
        }
    outputs = {"azureml_compute_name": "platform-dev-amlc", "azureml_tracking_uri": uri}
    (tmp_path / "outputs.json").write_text(json.dumps({**outputs, "jobs": {"tune": job}}))
    return ["--stack", "dev", "--outputs-file", str(tmp_path / "outputs.json")]


def _run(capsys, argv):
    capsys.readouterr()  # what MLflow's client printed while the test made the runs
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_trials_are_shown_best_first_with_the_ones_the_policy_stopped(server, tmp_path, capsys):
    job_id = _sweep(
        server,
        [("FINISHED", 0.9, "0.05"), ("KILLED", 2.5, "0.9"), ("FINISHED", 0.4, "0.01"),
         ("RUNNING", 1.1, "0.02"), ("FAILED", None, "0.3")],
    )  # fmt: skip
    code, out, _ = _run(capsys, ["trials", *_outputs(tmp_path, server, job_id)])
    assert code == 0
    lines = out.splitlines()
    assert re.split(r" {2,}", lines[0]) == ["TRIAL", "STATE", "VAL_LOSS", "LR", "BATCH_SIZE"]
    table = [re.split(r" {2,}", line.strip()) for line in lines[1:6]]
    assert [(row[1], row[2], row[3]) for row in table] == [
        ("finished", "0.4", "0.01"),
        ("finished", "0.9", "0.05"),
        ("running", "1.1", "0.02"),
        ("stopped early", "2.5", "0.9"),
        ("failed", "-", "0.3"),
    ]
    assert lines[6] == (
        f"5 trial(s) of sweep {job_id} (running): 1 failed, 2 finished, 1 running, 1 stopped early"
    )


def test_the_trials_of_a_cancelled_sweep_are_cancelled_not_stopped_early(server, tmp_path, capsys):
    job_id = _sweep(server, [("FINISHED", 0.5, "0.05"), ("KILLED", 0.7, "0.1")], cancelled=True)
    code, out, _ = _run(capsys, ["trials", *_outputs(tmp_path, server, job_id)])
    assert code == 0 and "stopped early" not in out
    assert (
        out.splitlines()[-1] == f"2 trial(s) of sweep {job_id} (cancelled): 1 cancelled, 1 finished"
    )


def test_a_job_that_is_no_sweep_or_a_workspace_out_of_reach_is_one_line(server, tmp_path, capsys):
    code, out, err = _run(capsys, ["trials", *_outputs(tmp_path, server, "dev-x", sweep=False)])
    assert (code, out) == (2, "")
    assert err.startswith("error: job=tune: has no trials; a sweep (jobs.tune.sweep) runs them")
    closed = f"http://127.0.0.1:{free_port()}"
    code, out, err = _run(capsys, ["trials", *_outputs(tmp_path, closed, "dev-x")])
    assert (code, out) == (1, "") and err.startswith(f"error: {closed}: ")
    assert err.count("\n") == 1
