"""A stack job's AzureML command, as infra.azureml_command renders it, run the way AzureML runs
it: by the fake AzureML jobs API (tests/support/fake_azureml_jobs.py) on two emulated nodes that
share no folder, each starting the command once in bash with the PyTorch distribution's
variables and the job's environmentVariables. The job trains, uploads its results and mirrors
its checkpoints to Blob; its replacement (a new image: a new job, the same run) resumes there."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dt_commands.jobs.main import main as dt_jobs
from infra.azureml_command import AzuremlJobSpec, environment_variables, job_command
from infra.trainer_command import trainer_flags
from tests.infra.fake_arm import start_arm
from tests.support.fake_azureml_jobs import FakeAzuremlJobs
from tests.support.fake_imds import IDENTITY
from tests.support.launchers import mirrored_checkpoints
from tests.support.stacks import REPO

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

WORKSPACE = (
    "/subscriptions/00000000-0000-0000-0000-00000000abcd/resourceGroups/rg-team-dev/providers/"
    "Microsoft.MachineLearningServices/workspaces/mlw-team-dev"
)
TINY = (
    ("model", "tiny"),
    ("num_classes", "5"),
    ("image_size", "16"),
    ("batch_size", "8"),
    ("synthetic_size", "64"),
    ("loader_workers", "0"),
    ("max_steps", "4"),
    ("checkpoint_every", "2"),
    ("log_every", "1"),
)


def _spec(blob_endpoint: str, image: str) -> AzuremlJobSpec:
    return AzuremlJobSpec(
        stack="amlrun",
        endpoint="",
        account_id="",
        pool_id="",
        node_count=2,
        vm_size="Standard_D2ds_v5",  # one worker per node, no InfiniBand preflight
        image_ref=f"acr.azurecr.io/trainer:{image}",
        registry_server="",
        node_identity_id="",
        node_identity_client_id=IDENTITY,  # the emulator's managed identity
        blob_endpoint=blob_endpoint,
        trainer_args=trainer_flags(TINY),
        dataset_prefix="",
        trainer_settings=TINY,
        tracking=(("MLFLOW_EXPERIMENT_NAME", "amlrun"),),
    )


def _body(spec: AzuremlJobSpec) -> dict:
    """The job as the stack declares it (tests/infra/test_azureml_jobs.py holds the rest)."""
    return {
        "properties": {
            "jobType": "Command",
            "command": job_command(spec),
            "distribution": {"distributionType": "PyTorch", "processCountPerInstance": 1},
            "resources": {"instanceCount": spec.node_count},
            "environmentVariables": environment_variables(spec),
        }
    }


@pytest.fixture
def aml(tmp_path, azurite_entra):
    from azure.core.exceptions import ResourceExistsError

    for name in ("logs", "outputs", "checkpoints"):  # the stack's containers (infra.storage)
        with contextlib.suppress(ResourceExistsError):
            azurite_entra.container(name).create_container()
    # What the image gives every process: `python` with the trainer importable.
    image = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    jobs = FakeAzuremlJobs(
        tmp_path / "nodes", writers={"deployer"}, env={**azurite_entra.env(), **image}
    )
    server, _ = start_arm(tmp_path, jobs.handle)
    yield jobs
    server.shutdown()
    server.server_close()


def _submit(jobs: FakeAzuremlJobs, spec: AzuremlJobSpec, body: dict | None = None) -> str:
    status, _, answer = jobs.handle(
        "PUT",
        f"{WORKSPACE}/jobs/{spec.job_id}",
        {},
        {"Authorization": "Bearer deployer"},
        body or _body(spec),
    )
    assert status == 201, answer
    return spec.job_id


def test_the_rendered_job_trains_on_two_nodes_and_its_replacement_resumes_from_blob(
    aml, azurite_entra, entra_env, tmp_path, capsys
):
    first = _spec(azurite_entra.blob_endpoint, "1")
    name = _submit(aml, first)
    assert aml.wait(name) == "Completed", aml.output(name)
    said = aml.output(name)
    assert "done: step 4 (started at 0, stopped by max_steps), 2 worker(s)" in said, said
    checkpoints = azurite_entra.container("checkpoints")
    run = f"{first.stack}/{first.run_name}/"
    assert mirrored_checkpoints(checkpoints, run), said
    outputs = [b.name for b in azurite_entra.container("outputs").list_blobs(name_starts_with=name)]
    assert outputs, said
    # Each node trained in a run folder of its own working folder: none is shared.
    assert (aml.folder / name / "node0" / "run").is_dir()
    # Each launcher copied its log to the job's folder, where dt-jobs logs reads them.
    outputs = {"azureml_compute_name": "c", "jobs": {"default": {"job_id": name}}}
    outputs["jobs"]["default"]["job_log_url"] = first.log_url
    (tmp_path / "outputs.json").write_text(json.dumps(outputs))
    capsys.readouterr()
    files = ["--stack", "amlrun", "--outputs-file", str(tmp_path / "outputs.json")]
    assert dt_jobs(["logs", *files, "--no-follow"]) == 0
    logs = capsys.readouterr().out
    assert logs.count("===== node ") == 2 and "===== node node-1 =====" in logs, logs
    assert logs.count("every worker finished") == 2, logs

    replaced = _spec(azurite_entra.blob_endpoint, "2")  # a new image: a new job, the same run
    assert replaced.job_id != name and replaced.run_name == first.run_name
    again = _submit(aml, replaced)
    assert aml.wait(again) == "Completed", aml.output(again)
    assert "resuming from the mirror's step-" in aml.output(again), aml.output(again)


def test_a_rendered_sweeps_trials_train_with_their_samples_in_folders_of_their_own(
    aml, azurite_entra
):
    """The sweep's trial command as infra.azureml_command renders it: the fake puts each
    trial's samples in, as AzureML does, and gives it its own MLFLOW_RUN_ID."""
    import yaml

    from infra.azureml_command import trial_command
    from infra.settings.sweep import read_sweep

    raw = {
        "space": {"lr": {"choice": [0.05, 0.1]}, "batch_size": {"choice": [4, 8]}},
        "objective": "loss",
        "trials": 2,
        "concurrentTrials": 2,
    }
    sweep = read_sweep("tune", raw, dict(TINY))
    own = tuple(pair for pair in TINY if pair[0] not in sweep.swept)
    spec = replace(
        _spec(azurite_entra.blob_endpoint, "1"),
        node_count=1,
        trainer_settings=own,
        trainer_args=trainer_flags(own),
        sweep=sweep.identity(),
    )
    body = _body(spec)
    body["properties"] = {
        "jobType": "Sweep",
        "trial": {**body["properties"], "command": trial_command(spec, sweep.swept)},
        "searchSpace": sweep.search_space(),
        "limits": {"maxTotalTrials": 2, "maxConcurrentTrials": 2},
    }
    name = _submit(aml, spec, body)
    assert aml.wait(name) == "Completed", aml.output(name)
    results = azurite_entra.container("outputs")
    for trial, values in aml.trials[name]:
        folder = f"{name}/trials/{trial}/"
        config = results.download_blob(f"{folder}config.yaml").readall()
        trained = yaml.safe_load(config)
        assert (trained["lr"], trained["batch_size"]) == (values["lr"], values["batch_size"])
    assert len({trial for trial, _ in aml.trials[name]}) == 2


def test_a_rendered_job_with_code_fetches_its_snapshot_on_each_node_and_runs_in_it(
    aml, azurite_entra, monkeypatch
):
    """A job's own command with its code (examples/torchrun_ddp): each node fetches and verifies
    the snapshot from the code container with the nodes' identity (trainer.launch.code_folder,
    for real), and the launcher runs the script in it under torchrun's variables."""
    from azure.core.exceptions import ResourceExistsError

    from infra.code_snapshot import snapshot

    snap = snapshot("examples/torchrun_ddp", REPO)
    code = azurite_entra.container("code")
    with contextlib.suppress(ResourceExistsError):
        code.create_container()
    code.upload_blob(snap.blob_name, snap.data, overwrite=True)
    spec = replace(
        _spec(azurite_entra.blob_endpoint, "1"),
        trainer_args=(),
        trainer_settings=(),
        command=("python", "train.py", "--steps", "4"),
        engine="torch",
        code_sha256=snap.sha256,
    )
    aml.env["PIP_NO_INDEX"] = "1"  # the snapshot has no requirements: nothing to fetch
    name = _submit(aml, spec)
    assert aml.wait(name) == "Completed", aml.output(name)
    for node in ("node0", "node1"):  # each node its own verified snapshot
        assert (aml.folder / name / node / "code" / "src" / "train.py").is_file()
    # Rank 0 checkpoints into DT_RUN_DIR, its node's own run folder (absolute: the script runs
    # in the code folder).
    checkpoints = aml.folder / name / "node0" / "run" / "checkpoints"
    assert list(checkpoints.glob("step-*.pt")), aml.output(name)
