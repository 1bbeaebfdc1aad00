"""TrainingJob payloads (real azure-batch model classes) and provider methods against an
autospec of the real BatchClient, so every call's signature is checked."""

import shlex
from unittest.mock import create_autospec

import pytest
from azure.batch import BatchClient
from azure.batch import models as m
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

from infra import job as job_module
from infra.job import (
    CONTAINER_RUN_OPTIONS,
    TASK_ID,
    JobSpec,
    TrainingJobProvider,
    job_options,
    task_options,
    trainer_command,
)
from trainer.cli import parse

SPEC = JobSpec(
    stack="vision-prod",
    endpoint="https://visionbatch.eastus.batch.azure.com",
    account_id="/subscriptions/s/resourceGroups/rg/providers/Microsoft.Batch/batchAccounts/b",
    pool_id="ib-gpu",
    node_count=4,
    vm_size="Standard_ND96isr_H100_v5",
    image_ref="visionacr.azurecr.io/trainer:0123456789abcdef@sha256:" + "a" * 64,
    registry_server="visionacr.azurecr.io",
    node_identity_id="/subscriptions/s/resourceGroups/rg/providers/x/userAssignedIdentities/n",
    node_identity_client_id="11111111-2222-3333-4444-555555555555",
    blob_endpoint="https://visiondata.blob.core.windows.net/",
    trainer_args=("--model", "resnet50", "--batch-size", "256", "--fp16-allreduce"),
    dataset_prefix="",
)


def _bash_words(command_line: str) -> list[str]:
    prefix = "/bin/bash -c "
    assert command_line.startswith(prefix)
    (inner,) = shlex.split(command_line[len(prefix) :])
    return shlex.split(inner)


def test_job_runs_on_the_pool_and_ends_with_its_task():
    job = job_options(SPEC)
    assert isinstance(job, m.BatchJobCreateOptions)
    assert job.id == SPEC.job_id and job.pool_info.pool_id == "ib-gpu"
    assert job.all_tasks_complete_mode == "terminatejob"
    assert job.job_preparation_task is None
    assert {item.name: item.value for item in job.metadata} == {
        "stack": "vision-prod",
        "run": SPEC.run_name,
    }
    assert job.as_dict()["poolInfo"] == {"poolId": "ib-gpu"}  # the wire format Batch receives


def test_task_is_multi_instance_with_infiniband_container_options():
    task = task_options(SPEC)
    assert isinstance(task, m.BatchTaskCreateOptions) and task.id == TASK_ID
    assert task.multi_instance_settings.number_of_instances == 4
    container = task.container_settings
    assert container.image_name == SPEC.image_ref
    for option in (
        "--network host",
        "--ipc host",
        "--ulimit memlock=-1",
        "--device /dev/infiniband",
        "--cap-add IPC_LOCK",
        "--shm-size",
    ):
        assert option in container.container_run_options
    assert container.container_run_options == CONTAINER_RUN_OPTIONS
    assert container.registry.registry_server == "visionacr.azurecr.io"
    assert container.registry.identity_reference.resource_id == SPEC.node_identity_id
    assert {b.source for b in container.container_host_batch_bind_mounts} == {
        "Task",
        "Shared",
        "VfsMounts",
        "JobPrep",
    }
    assert task.constraints.max_task_retry_count == 3
    assert task.user_identity.auto_user.elevation_level == "nonadmin"
    assert task.environment_settings[0].name == "AZURE_CLIENT_ID"
    destinations = [o.destination.container for o in task.output_files]
    assert {d.container_url for d in destinations} == {
        "https://visiondata.blob.core.windows.net/logs"
    }
    assert {d.path for d in destinations} == {
        f"{SPEC.job_id}/stdout.txt",
        f"{SPEC.job_id}/stderr.txt",
    }
    assert all(d.identity_reference.resource_id == SPEC.node_identity_id for d in destinations)
    assert {o.upload_options.upload_condition for o in task.output_files} == {"taskcompletion"}


def test_every_node_runs_the_launcher_with_a_trainer_command_our_cli_accepts():
    words = _bash_words(task_options(SPEC).command_line)
    split = words.index("--")
    assert words[:split] == [
        "python",
        "-m",
        "trainer.launch",
        "--vm-size",
        "Standard_ND96isr_H100_v5",
    ]
    trainer = words[split + 1 :]
    assert trainer[:3] == ["python", "-m", "trainer"]
    output_dir = "${AZ_BATCH_NODE_MOUNTS_DIR}/shared/runs/vision-prod/" + SPEC.run_name
    assert trainer[-2:] == ["--output-dir", output_dir]
    request = parse(trainer[3:])
    assert request.config.backend == "horovod" and request.config.fp16_allreduce
    coordination = task_options(SPEC).multi_instance_settings.coordination_command_line
    assert '[ "$AZ_BATCH_IS_CURRENT_NODE_MASTER" != true ]' in coordination
    assert "nohup python -m trainer.launch" in coordination


def test_dataset_prefix_adds_a_staging_preparation_task_and_shard_flags():
    spec = JobSpec(**{**SPEC.__dict__, "dataset_prefix": "imagenet"})
    prep = job_options(spec).job_preparation_task
    assert prep is not None and prep.wait_for_success is True
    words = _bash_words(prep.command_line)
    assert words[:4] == ["python", "-m", "trainer.data", "stage"]
    assert words[words.index("--dest") + 1] == "${AZ_BATCH_NODE_SHARED_DIR}/datasets/imagenet"
    assert words[words.index("--account-url") + 1] == "https://visiondata.blob.core.windows.net/"
    command = trainer_command(spec)
    assert command[command.index("--data") + 1] == "shards"
    assert (
        command[command.index("--data-dir") + 1] == "${AZ_BATCH_NODE_SHARED_DIR}/datasets/imagenet"
    )


def test_job_ids_change_with_any_input_and_checkpoints_follow_the_training_settings():
    new_image = JobSpec(**{**SPEC.__dict__, "image_ref": SPEC.image_ref.replace("a", "b")})
    assert new_image.job_id != SPEC.job_id
    assert new_image.run_name == SPEC.run_name  # new code resumes the same run
    more_epochs = JobSpec(**{**SPEC.__dict__, "trainer_args": ("--epochs", "100")})
    assert more_epochs.run_name != SPEC.run_name
    assert len(SPEC.job_id) <= 64


@pytest.fixture
def client(monkeypatch):
    fake = create_autospec(BatchClient, instance=True)
    fake.get_job.return_value = m.BatchJob(state="active")
    monkeypatch.setattr(job_module, "_client", lambda endpoint: fake)
    return fake


def _props(spec=SPEC):
    return {**spec.__dict__, "trainer_args": list(spec.trainer_args)}


def test_create_submits_the_job_then_its_task(client):
    result = TrainingJobProvider().create(_props())
    assert result.id == SPEC.job_id
    (job,), _ = client.create_job.call_args
    assert job.id == SPEC.job_id
    client.create_task.assert_called_once()
    job_id, task = client.create_task.call_args.args
    assert job_id == SPEC.job_id and task.id == TASK_ID
    assert result.outs["state"] == "active"
    assert result.outs["log_url"] == f"https://visiondata.blob.core.windows.net/logs/{SPEC.job_id}/"
    assert result.outs["checkpoint_path"] == f"shared/runs/vision-prod/{SPEC.run_name}"


def test_a_rejected_task_deletes_the_job_it_left(client):
    client.create_task.side_effect = HttpResponseError("InvalidPropertyValue")
    with pytest.raises(HttpResponseError):
        TrainingJobProvider().create(_props())
    client.begin_delete_job.assert_called_once_with(SPEC.job_id)


def test_any_input_change_replaces_the_job_delete_first():
    provider = TrainingJobProvider()
    olds = {**_props(), "state": "active", "job_id": SPEC.job_id}
    same = provider.diff(SPEC.job_id, olds, _props())
    assert same.changes is False
    new_provider_code = {**_props(), "__provider": "a different serialization"}
    assert (
        provider.diff(SPEC.job_id, {**olds, "__provider": "x"}, new_provider_code).changes is False
    )
    changed = provider.diff(SPEC.job_id, olds, {**_props(), "node_count": 8})
    assert changed.changes is True and changed.replaces == ["node_count"]
    assert changed.delete_before_replace is True


def test_read_refreshes_state_and_forgets_deleted_jobs(client):
    client.get_job.return_value = m.BatchJob(state="completed")
    assert TrainingJobProvider().read(SPEC.job_id, _props()).outs["state"] == "completed"
    client.get_job.side_effect = ResourceNotFoundError("gone")
    assert TrainingJobProvider().read(SPEC.job_id, _props()).id is None


def test_delete_terminates_a_running_job_then_deletes_it(client):
    TrainingJobProvider().delete(SPEC.job_id, _props())
    client.begin_terminate_job.assert_called_once_with(SPEC.job_id)
    client.begin_delete_job.assert_called_once_with(SPEC.job_id)
    client.reset_mock()
    client.get_job.return_value = m.BatchJob(state="completed")
    TrainingJobProvider().delete(SPEC.job_id, _props())
    client.begin_terminate_job.assert_not_called()
    client.get_job.side_effect = ResourceNotFoundError("gone")
    TrainingJobProvider().delete(SPEC.job_id, _props())  # already gone: nothing to do
