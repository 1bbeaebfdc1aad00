"""A job's hyperparameter sweep (jobs.<name>.sweep) on the AzureML backend: a native sweep job
through Pulumi's mocks against what AzureML documents (read 2026-11-29, MicrosoftDocs/
azure-ai-docs articles/machine-learning/how-to-tune-hyperparameters.md and
reference-yaml-job-sweep.md; azure-ai-ml search_space.py for each distribution's REST form), its
trial command run in bash as AzureML runs it once it has put the sampled values in, and every
bad sweep refused in one line before anything is created."""

from __future__ import annotations

import os
import subprocess

import pytest

from dt_commands.plan import evaluate
from infra.azureml_command import trial_command
from tests.infra.test_azureml_compute import _refusal, azureml
from tests.infra.test_azureml_jobs import JOB, _spec
from tests.support.stacks import one

DEMO = "trainer/presets/demo.yaml"
SWEEP = {
    "space": {"lr": {"loguniform": [-7, -2]}, "batch_size": {"choice": [32, 64]}},
    "objective": "val_loss",
    "trials": 8,
    "concurrentTrials": 2,
    "stop": {"policy": "bandit", "slackFactor": 0.1, "delayEvaluation": 2},
}


def _values(backend: str = "azureml", **sweep) -> dict:
    values = azureml(
        jobs={"tune": {"trainerConfig": DEMO, "nodes": 1, "sweep": {**SWEEP, **sweep}}}
    )
    del values["gpu-cluster:submitJob"]
    values["gpu-cluster:backend"] = backend
    return values


@pytest.fixture(scope="module")
def sweep_plan():
    return evaluate("dev", _values())


def test_a_sweep_is_a_native_sweep_job_of_the_documented_shape(sweep_plan):
    props = one(sweep_plan, JOB).inputs["properties"]
    assert props["jobType"] == "Sweep"
    assert props["objective"] == {"primaryMetric": "val_loss", "goal": "Minimize"}
    assert props["samplingAlgorithm"]["samplingAlgorithmType"] == "Random"
    # search_space.py: [distribution, [numbers]], a choice's values as one list.
    assert props["searchSpace"] == {
        "lr": ["loguniform", [-7, -2]],
        "batch_size": ["choice", [[32, 64]]],
    }
    assert props["limits"] == {
        "jobLimitsType": "Sweep",
        "maxTotalTrials": 8,
        "maxConcurrentTrials": 2,
        "timeout": "PT168H",
    }
    stop = props["earlyTermination"]
    assert stop["policyType"] == "Bandit" and stop["slackFactor"] == 0.1
    assert stop["evaluationInterval"] == 1 and stop["delayEvaluation"] == 2
    trial = props["trial"]
    assert trial["distribution"] == {"distributionType": "PyTorch", "processCountPerInstance": 1}
    assert trial["resources"]["instanceCount"] == sweep_plan.settings.jobs[0].nodes
    assert trial["environmentVariables"]["MLFLOW_EXPERIMENT_NAME"] == "dev"
    assert props["computeId"].endswith("platform-dev-amlc")


def test_the_plan_names_the_sweeps_budget_and_objective(sweep_plan):
    from dt_commands.plan import render

    text = render(sweep_plan, 0)
    job = sweep_plan.outputs["jobs"]["tune"]["job_id"]
    assert f"  tune: 1 node(s), job {job}, each trial trains afresh" in text
    assert "    sweep: 8 trials, 2 at once, minimize val_loss" in text


def test_the_trial_command_takes_the_sampled_values_and_works_in_folders_of_its_own(sweep_plan):
    command = one(sweep_plan, JOB).inputs["properties"]["trial"]["command"]
    # Each swept setting once, as AzureML's placeholder; the file's own value left out.
    assert command.count("--lr ") == 1 and "--lr '${{search_space.lr}}'" in command
    assert "--batch-size '${{search_space.batch_size}}'" in command
    assert "--checkpoint-mirror-url" not in command  # a trial is never resumed


def test_a_trial_command_runs_in_bash_as_azureml_gives_it(tmp_path):
    """AzureML puts each sampled value in for ${{search_space.<name>}} and runs the command with
    the trial's MLFLOW_RUN_ID; a stub python records what the launcher is given."""
    spec = _spec(trainer_settings=(("model", "tiny"),), sweep="x")
    command = trial_command(spec, ("lr", "batch_size"))
    sampled = command.replace("${{search_space.lr}}", "0.0123").replace(
        "${{search_space.batch_size}}", "64"
    )
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "python").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$STUB_LOG"\n')
    (stubs / "python").chmod(0o755)
    log = tmp_path / "call"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log)}
    env["MLFLOW_RUN_ID"] = "trial_7"
    subprocess.run(["bash", "-c", sampled], env=env, cwd=tmp_path, check=True, timeout=60)
    words = log.read_text().split("\0")[:-1]
    flag = lambda name, after=0: words[words.index(name, after) + 1]  # noqa: E731
    workers = words.index("--")
    assert flag("--token-url") == f"{spec.log_url}trials/trial_7/"
    assert flag("--lr", workers) == "0.0123" and flag("--batch-size", workers) == "64"
    assert flag("--metrics-upload-url", workers) == f"{spec.log_url}trials/trial_7/live/"
    assert flag("--outputs-url", workers) == f"{spec.outputs_url}trials/trial_7/"


@pytest.mark.parametrize(
    ("sweep", "starts"),
    [
        ({"space": {"learning_speed": {"uniform": [0.1, 0.2]}}}, "space.learning_speed: names no"),
        ({"space": {"output_dir": {"choice": ["a"]}}}, "space.output_dir: names no trainer"),
        ({"space": {"lr": {"uniform": [0.1, 5000]}}}, "space.lr: 5000 is refused by the trainer"),
        ({"space": {"lr": {"uniform": [0.2, 0.1]}}}, "space.lr.uniform=[0.2, 0.1]: give numbers"),
        ({"space": {"lr": {"gaussian": [0, 1]}}}, "space.lr={'gaussian': [0, 1]}: give one of"),
        ({"space": {"fp16_allreduce": {"choice": [True]}}}, "space.fp16_allreduce: a switch"),
        ({"objective": "val_f1"}, "objective='val_f1': the trainer logs val_loss"),
        ({"sampling": "grid"}, "space.lr: grid sampling takes choice, not loguniform"),
        ({"sampling": "bayesian", "space": {"lr": {"uniform": [0.01, 0.1]}}}, "stop: Bayesian"),
        ({"trials": 0}, "trials=0: give a whole number in 1..1000"),
        ({"concurrentTrials": 9}, "concurrentTrials=9: give a whole number in 1..8"),
        ({"stop": {"policy": "bandit"}}, "stop: the bandit policy takes one of slackFactor"),
        ({"stop": {"policy": "median", "slackFactor": 0.1}}, "stop.slackFactor: not a field"),
    ],
)
def test_a_bad_sweep_is_one_line_naming_the_setting(sweep, starts):
    line = _refusal(_values(**sweep))
    assert line.startswith(f"jobs.tune.sweep.{starts}"), line


def test_more_concurrent_trials_than_the_cluster_holds_is_refused_in_one_line():
    values = _values()
    values["gpu-cluster:jobs"]["tune"]["nodes"] = 2
    line = _refusal(values)  # 2 trials x 2 nodes on the dev stack's 2 nodes
    assert line == (
        "jobs.tune.sweep.concurrentTrials=2: each trial takes 2 node(s) and the compute cluster "
        "has 2 (nodeCount), so at most 1 run at once; lower it or raise nodeCount"
    )


def test_a_sweep_on_batch_or_of_a_command_job_is_refused_in_one_line():
    line = _refusal(_values(backend="batch"))
    assert line.startswith("jobs.tune.sweep with backend=batch: ") and "set backend" in line
    values = _values()
    values["gpu-cluster:jobs"]["tune"] = {"command": "python -m trainer", "sweep": SWEEP}
    assert _refusal(values).startswith("jobs.tune.sweep: a sweep varies the trainer's settings")


def test_numbers_given_as_text_by_pulumi_config_set_path_are_read_as_numbers():
    """`pulumi config set --path jobs.tune.sweep.trials 8` stores "8": the same sweep."""
    text = {
        "space": {"lr": {"uniform": ["0.01", "0.2"]}, "batch_size": {"choice": ["32", "64"]}},
        "trials": "8",
        "concurrentTrials": "2",
        "stop": {"policy": "bandit", "slackFactor": "0.1", "delayEvaluation": "2"},
    }
    plan = evaluate("dev", _values(**text))
    props = one(plan, JOB).inputs["properties"]
    assert props["searchSpace"]["lr"] == ["uniform", [0.01, 0.2]]
    assert (
        props["limits"]["maxTotalTrials"] == 8 and props["earlyTermination"]["slackFactor"] == 0.1
    )
