"""``dt-jobs fetch``: a job's results from its ``outputs_url``, uploaded by the
trainer's own ``trainer.outputs.results.upload`` to Azurite over HTTPS and read with
DefaultAzureCredential (a managed identity here, as ``az login`` would be on a laptop); and the
``outputs_url`` the stack gives each job, under Pulumi's mocks."""

from __future__ import annotations

import json

import pytest

from dt_commands.jobs import main as dt_jobs
from dt_commands.stack_outputs import select_job
from infra.batch import trainer_command
from infra.job_spec import JobSpec
from infra.storage import CONTAINERS
from tests.support.stacks import one
from trainer.common.blob_folder import BlobFolder
from trainer.models.build import build_model
from trainer.outputs import results
from trainer.settings.train_config import TrainConfig

JOB_ID = "dev-resnet-0123456789"


@pytest.fixture
def outputs(entra_env, tmp_path):
    """A container standing for the stack's ``outputs``, with a job's results uploaded."""
    container = entra_env.container("o" + str(abs(hash(str(tmp_path))))[:12])
    container.create_container()
    model = build_model("tiny", 5)
    local = tmp_path / "run" / "results"
    results.write(
        local,
        results.full_state_dict(model, sharded=False, is_root=True),
        config=TrainConfig(model="tiny", num_classes=5).to_dict(),
        summary={"step": 6, "stopped_by": "max_steps"},
        evaluation=results.evaluation_summary(None, 6, False, "images"),
        weights_metadata={"format": "pt"},
    )
    url = entra_env.folder_url(container.container_name, f"{JOB_ID}/")
    results.upload(local, BlobFolder.parse(url))
    stack = tmp_path / "outputs.json"
    stack.write_text(json.dumps({"jobs": {"resnet": {"job_id": JOB_ID, "outputs_url": url}}}))
    yield container, local, stack
    container.delete_container()


def _fetch(stack, *more):
    return dt_jobs.main(["fetch", "--stack", "dev", "--outputs-file", str(stack), *more])


def _refused(capsys, stack, *more) -> tuple[int, str]:
    with pytest.raises(SystemExit) as caught:
        _fetch(stack, *more)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return caught.value.code, err


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_fetch_downloads_every_file_verified_into_the_folder(outputs, tmp_path, capsys):
    _, local, stack = outputs
    dest = tmp_path / "fetched"
    assert _fetch(stack, "--to", str(dest)) == 0
    assert _files(dest) == _files(local)
    out = capsys.readouterr().out
    assert out.startswith(f"job resnet ({JOB_ID}): 4 file(s), ")
    assert "verified against manifest.json" in out and str(dest) in out
    assert list(tmp_path.glob(".fetched*")) == []


def test_the_default_folder_is_results_of_the_job(outputs, tmp_path, monkeypatch):
    _, local, stack = outputs
    monkeypatch.chdir(tmp_path)
    assert _fetch(stack) == 0
    assert _files(tmp_path / "results" / "resnet") == _files(local)


def test_without_a_manifest_the_run_has_not_finished_and_nothing_is_written(
    outputs, tmp_path, capsys
):
    container, _, stack = outputs
    container.delete_blob(f"{JOB_ID}/manifest.json")  # as while the trainer uploads
    code, err = _refused(capsys, stack, "--to", str(tmp_path / "fetched"))
    assert code == 1
    assert f"job resnet ({JOB_ID}): no results at " in err
    assert "(manifest.json is missing): the run has not finished" in err
    assert not (tmp_path / "fetched").exists() and not list(tmp_path.glob(".fetched*"))


def test_a_corrupted_file_is_refused_and_nothing_is_left(outputs, tmp_path, capsys):
    container, local, stack = outputs
    data = bytearray((local / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF
    container.upload_blob(f"{JOB_ID}/model.safetensors", bytes(data), overwrite=True)
    code, err = _refused(capsys, stack, "--to", str(tmp_path / "fetched"))
    assert code == 1
    assert f"{JOB_ID}/model.safetensors: SHA-256 " in err and "differs from manifest.json's" in err
    assert not (tmp_path / "fetched").exists() and not list(tmp_path.glob(".fetched*"))


def test_a_file_listed_but_not_uploaded_is_refused(outputs, tmp_path, capsys):
    container, _, stack = outputs
    container.delete_blob(f"{JOB_ID}/metrics.json")
    code, err = _refused(capsys, stack, "--to", str(tmp_path / "fetched"))
    assert code == 1 and "metrics.json: listed in manifest.json but not uploaded" in err
    assert not (tmp_path / "fetched").exists() and not list(tmp_path.glob(".fetched*"))


def test_a_folder_with_files_is_refused_unless_forced(outputs, tmp_path, capsys):
    _, local, stack = outputs
    dest = tmp_path / "fetched"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    code, err = _refused(capsys, stack, "--to", str(dest))
    assert code == 2
    assert f"to={dest}: exists and is not empty; pass --force" in err
    assert _files(dest) == {"notes.txt": b"mine"}
    assert _fetch(stack, "--to", str(dest), "--force") == 0
    assert _files(dest) == _files(local)  # replaced whole
    assert list(tmp_path.glob(".fetched*")) == []


def test_a_stack_without_outputs_url_says_so(tmp_path, capsys):
    stack = tmp_path / "outputs.json"
    stack.write_text(json.dumps({"jobs": {"resnet": {"job_id": JOB_ID}}}))
    code, err = _refused(capsys, stack)
    assert code == 2 and "job resnet has no outputs_url output" in err


def test_each_job_passes_its_outputs_folder_to_the_trainer_and_names_it_in_its_outputs(
    dev_plan,
):
    job = one(dev_plan, "pulumi-python:dynamic:Resource")
    spec = JobSpec.from_props(job.inputs)
    url = dev_plan.outputs["jobs"]["default"]["outputs_url"]
    folder = BlobFolder.parse(url)
    assert url == spec.outputs_url and folder.prefix == f"{spec.job_id}/"
    assert folder.container == "outputs" and "outputs" in CONTAINERS
    assert url.startswith(job.inputs["blob_endpoint"].rstrip("/") + "/")
    command = trainer_command(spec)
    assert command[command.index("--outputs-url") + 1] == url
    # what ``fetch`` reads: the job's outputs as `pulumi stack output --json` gives them
    selected = select_job(dev_plan.outputs, "dev", "default")
    assert selected.outputs["outputs_url"] == url
