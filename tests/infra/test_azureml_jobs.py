"""The stack's jobs on the AzureML backend as native command jobs, every property through
Pulumi's mocks against what AzureML documents (read 2026-11-29, MicrosoftDocs/azure-ai-docs
articles/machine-learning/): how-to-train-distributed-gpu.md (a PyTorch distribution, one
process per instance: the launcher starts the node's workers), reference-yaml-job-command.md
(limits.timeout, experiment_name, a name unique in the workspace),
how-to-identity-based-service-authentication.md (identity: managed; the user-assigned identity
found by its client id); and what the backend refuses (a code snapshot, a priority)."""

from __future__ import annotations

import itertools
import re
import shlex

import pytest

from dt_commands.mocks import mock_resource_id
from dt_commands.plan import evaluate
from infra.azureml_command import RUN_DIR, AzuremlJobSpec
from infra.azureml_job import AZUREML_JOB_OUTPUTS
from tests.infra.test_azureml_compute import COMPUTE, ENVIRONMENT_VERSION, _refusal, azureml
from tests.support.stacks import one

JOB = "azure-native:machinelearningservices:Job"
GUARD = "pulumi-python:dynamic/azureml:JobGuard"
# The names of AzureML's workspace assets (Azure/bicep-types-az, generated/
# machinelearningservices 2024-04-01-preview types.md: codes, components, data, models).
NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9\-_]{0,254}$")
DEMO = "trainer/presets/demo.yaml"


@pytest.fixture(scope="module")
def job_plan():
    return evaluate("dev", azureml(submitJob=True))


def _jobs(**jobs) -> dict:
    values = azureml(jobs=jobs)
    del values["gpu-cluster:submitJob"]
    return values


def test_the_stacks_job_is_a_command_job_on_its_compute_in_the_trainers_environment(job_plan):
    job = one(job_plan, JOB).inputs
    props = job["properties"]
    assert props["jobType"] == "Command"
    assert props["computeId"] == mock_resource_id(COMPUTE, one(job_plan, COMPUTE).name)
    assert props["environmentId"] == mock_resource_id(
        ENVIRONMENT_VERSION, one(job_plan, ENVIRONMENT_VERSION).name
    )
    assert job["workspaceName"] == one(job_plan, COMPUTE).inputs["workspaceName"]
    assert job["resourceGroupName"] == "rg-platform-dev"
    assert NAME.match(job["id"]) and job["id"] == job_plan.outputs["job_id"]
    # One process per node (the launcher), on every node of the job.
    assert props["distribution"] == {"distributionType": "PyTorch", "processCountPerInstance": 1}
    assert props["resources"]["instanceCount"] == job_plan.settings.cluster.node_count
    assert props["resources"]["shmSize"] == "64g"  # as Batch's containers on an IB size
    assert props["experimentName"] == "dev" and props["displayName"] == "dev training"


def test_the_job_runs_as_the_nodes_identity_and_stops_at_its_wall_clock_limit(job_plan):
    props = one(job_plan, JOB).inputs["properties"]
    nodes = mock_resource_id(
        "azure-native:managedidentity:UserAssignedIdentity", "platform-dev-nodes"
    )
    assert props["identity"] == {"identityType": "Managed", "resourceId": nodes}
    assert props["environmentVariables"]["AZURE_CLIENT_ID"] == "client-platform-dev-nodes"
    assert props["environmentVariables"]["MLFLOW_EXPERIMENT_NAME"] == "dev"
    hours = job_plan.settings.jobs[0].max_wall_clock_hours
    assert props["limits"] == {"jobLimitsType": "Command", "timeout": f"PT{hours}H"}
    unlimited = evaluate("dev", _jobs(a={"trainerConfig": DEMO, "maxWallClockHours": 0}))
    assert "limits" not in one(unlimited, JOB).inputs["properties"]


def test_the_command_execs_the_launcher_on_azureml_over_the_trainer(job_plan):
    props = one(job_plan, JOB).inputs["properties"]
    words = shlex.split(props["command"])
    assert words[0] == "exec"
    launcher, trainer = words[1 : words.index("--")], words[words.index("--") + 1 :]
    assert launcher[:5] == ["python", "-m", "trainer.launch", "--platform", "azureml"]
    job = job_plan.outputs["jobs"]["default"]
    flags = dict(zip(launcher[5::2], launcher[6::2], strict=True))
    assert flags["--token-url"] == job["job_log_url"]
    assert flags["--vm-size"] == job_plan.settings.cluster.vm_size
    assert flags["--run-dir"] == RUN_DIR
    assert trainer[:3] == ["python", "-m", "trainer"]
    given = dict(itertools.pairwise(trainer[3:]))  # each flag with the word after it
    # The nodes share no folder: the checkpoints live in Blob, under the run's own path.
    assert given["--output-dir"] == RUN_DIR
    assert given["--checkpoint-mirror-url"] == job["checkpoint_mirror_url"]
    assert given["--metrics-upload-url"] == job["metrics_url"]
    assert given["--outputs-url"] == job["outputs_url"]


def test_the_job_waits_for_its_guard_and_is_left_in_azureml_when_pulumi_deletes_it(job_plan):
    job = one(job_plan, JOB)
    guard = one(job_plan, GUARD)
    assert guard.name in job_plan.depends_on[job.name]
    workspace = mock_resource_id(
        "azure-native:machinelearningservices:Workspace", "mlw-platform-dev"
    )
    assert guard.inputs["job"] == f"{workspace}/jobs/{job.inputs['id']}"
    assert guard.inputs["label"] == "default" and guard.inputs["protect_running"] is True
    (registration,) = [r for r in job_plan.registered.values() if r.typ == JOB]
    assert registration.retain_on_delete
    # The compute (its cluster, its environment, the team's role) exists before the guard.
    (guarded,) = [r for r in job_plan.registered.values() if r.typ == GUARD]
    after = {urn.rsplit("::", 1)[-1] for urn in guarded.dependencies}
    assert {one(job_plan, COMPUTE).name, one(job_plan, ENVIRONMENT_VERSION).name} <= after


def test_the_jobs_outputs_name_its_studio_page_and_blob_folders(job_plan):
    job = job_plan.outputs["jobs"]["default"]
    assert set(job) == {*AZUREML_JOB_OUTPUTS, "node_count"}
    assert job["job_state"] == "NotStarted"
    assert job["job_studio_url"].startswith(f"https://ml.azure.com/runs/{job['job_id']}?wsid=")
    assert job["job_log_url"].endswith(f"/logs/{job['job_id']}/")
    assert job_plan.outputs["job_studio_url"] == job["job_studio_url"]


def test_the_plan_shows_each_job_where_its_run_resumes_and_what_it_runs(job_plan):
    from dt_commands.plan import render

    text = render(job_plan, 0)
    job = job_plan.outputs["jobs"]["default"]
    run = job["checkpoint_mirror_url"].split(".net/")[1]
    assert f"  default: 2 node(s), job {job['job_id']}, run in Blob {run}" in text
    assert "    runs: python -m trainer --model resnet50 " in text
    assert "    limit: AzureML cancels it after PT168H" in text


def test_replace_jobs_lets_the_guard_replace_a_running_job():
    plan = evaluate("dev", azureml(submitJob=True, replaceJobs=["default"]))
    assert one(plan, GUARD).inputs["protect_running"] is False


def _spec(**changes) -> AzuremlJobSpec:
    values = dict(
        stack="dev",
        endpoint="",
        account_id="",
        pool_id="",
        node_count=2,
        vm_size="Standard_ND96isr_H100_v5",
        image_ref="acr.azurecr.io/trainer:1@sha256:" + "a" * 64,
        registry_server="",
        node_identity_id="",
        node_identity_client_id="c",
        blob_endpoint="https://a.blob.core.windows.net/",
        trainer_args=("--model", "tiny"),
        dataset_prefix="",
        trainer_settings=(("model", "tiny"),),
        max_wall_clock_hours=0,
    )
    return AzuremlJobSpec(**{**values, **changes})


def test_any_change_is_a_new_job_the_wall_clock_limit_too_but_the_same_run():
    base = _spec()
    for change in (
        {"max_wall_clock_hours": 24},
        {"image_ref": "acr.azurecr.io/trainer:2@sha256:" + "b" * 64},
        {"node_count": 4},
        {"tracking": (("MLFLOW_EXPERIMENT_NAME", "other"),)},
    ):
        changed = _spec(**change)
        assert changed.job_id != base.job_id, change
        # The same training settings resume the same run from the Blob mirror.
        assert changed.checkpoint_mirror_url == base.checkpoint_mirror_url, change
    assert _spec(trainer_settings=(("model", "tiny"),)).job_id == base.job_id


def test_a_priority_on_azureml_is_refused_in_one_line():
    line = _refusal(_jobs(a={"trainerConfig": DEMO, "priority": 5}))
    assert line.startswith("jobs.a.priority=5 with backend=azureml: ") and "remove it" in line


def test_a_job_with_code_waits_for_its_upload_and_fetches_it_before_its_launcher():
    code = "examples/torchrun_ddp"
    values = _jobs(ddp={"command": "python train.py --steps 4", "code": code})
    values["gpu-cluster:storageAllowedIps"] = ["203.0.113.7"]  # the deployer uploads it
    plan = evaluate("dev", values)
    guard = [r for r in plan.registered.values() if r.typ == GUARD]
    upload = [r.name for r in plan.resources if r.name.startswith("platform-dev-code-")]
    assert len(upload) == 1 and len(guard) == 1
    assert upload[0] in {urn.rsplit("::", 1)[-1] for urn in guard[0].dependencies}
    command = one(plan, JOB).inputs["properties"]["command"]
    fetch, launch = command.split(" && ")
    sha = plan.settings.jobs[0].code.sha256
    assert shlex.split(fetch) == [
        "python", "-m", "trainer.launch.code_folder",
        "--account-url", plan.outputs["jobs"]["ddp"]["job_log_url"].split("/logs/")[0] + "/",
        "--sha256", sha, "--link", "code", "--cache-root", "code-cache",
    ]  # fmt: skip
    words = shlex.split(launch)
    assert words[words.index("--code-dir") + 1] == "code"
    assert words[words.index("--") + 1 :] == ["python", "train.py", "--steps", "4"]


def _run_in_bash(tmp_path, command: str, stage_exit: int) -> tuple[int, list[list[str]]]:
    """``command`` as AzureML runs it (bash), with a stub ``python`` recording its words."""
    import os
    import subprocess

    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    python = stubs / "python"
    python.write_text(
        '#!/bin/bash\nprintf "%s\\0" "$@" >> "$STUB_LOG"; printf "\\n" >> "$STUB_LOG"\n'
        'if [ "$3" = stage ]; then exit "$STAGE_EXIT"; fi\n'
    )
    python.chmod(0o755)
    log = tmp_path / f"calls-{stage_exit}"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log)}
    env["STAGE_EXIT"] = str(stage_exit)
    done = subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, timeout=60, check=False)
    calls = [line.split("\0")[:-1] for line in log.read_text().splitlines()]
    return done.returncode, calls


def test_a_staged_dataset_is_copied_to_each_node_before_its_launcher_starts(tmp_path):
    from infra.azureml_command import job_command

    spec = _spec(dataset_prefix="imagenet/shards'; rm -rf ~")
    code, calls = _run_in_bash(tmp_path, job_command(spec), stage_exit=0)
    assert code == 0
    stage, launch = calls
    assert stage[:3] == ["-m", "trainer.data", "stage"]
    dest = "datasets/imagenet/shards'; rm -rf ~"  # a word, never run
    assert stage[stage.index("--prefix") + 1] == "imagenet/shards'; rm -rf ~"
    assert stage[stage.index("--dest") + 1] == dest
    assert launch[:2] == ["-m", "trainer.launch"]
    trainer = launch[launch.index("--") + 1 :]
    assert trainer[trainer.index("--data-dir") + 1] == dest
    assert trainer[trainer.index("--data") + 1] == "shards"
    # A node whose staging fails starts no launcher; the job fails with the stage's status.
    code, calls = _run_in_bash(tmp_path, job_command(spec), stage_exit=3)
    assert code == 3 and len(calls) == 1
