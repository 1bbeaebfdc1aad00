"""TrainingJob payloads (real azure-batch model classes), the command lines executed the way a
node runs them (Dockerfile ENTRYPOINT/CMD, bash, Batch's variables, a stub ``python`` that
records what ran), and the provider with the real installed SDK against a fake Batch server."""

from __future__ import annotations

import re
import time

import pulumi
import pytest
from azure.batch import models as m
from azure.core.credentials import AccessToken

from infra import batch as batch_module
from infra import batch_calls as calls_module
from infra import credentials
from infra import job as job_module
from infra.batch import (
    CONTAINER_RUN_OPTIONS,
    CPU_CONTAINER_RUN_OPTIONS,
    NVME_ROOT,
    TASK_ID,
    job_options,
    task_options,
    trainer_command,
)
from infra.batch_calls import JobError
from infra.job import TrainingJobProvider
from infra.job_spec import JobSpec
from infra.trainer_command import JobTrainer, trainer_flags
from tests.support.container import (
    base_path,
    container_argv,
    image_command,
    one_node_pool,
    recorded,
    run_in_container,
    stub_program,
)
from tests.support.fake_batch import FakeBatch
from trainer.launch.main import build_parser as launch_parser
from trainer.settings.flags import parse

NVME_BIND = f"-v {NVME_ROOT}:{NVME_ROOT}"

# The job's own trainer settings, as a stack's trainer file gives them (infra.trainer_command).
OWN = (("model", "resnet50"), ("batch_size", "256"), ("fp16_allreduce", True))
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
    trainer_args=trainer_flags(OWN),
    dataset_prefix="",
    trainer_settings=OWN,
)


def _spec(**changes) -> JobSpec:
    return JobSpec(**{**SPEC.__dict__, **changes})


def _trained(settings: JobTrainer, **changes) -> JobSpec:
    """SPEC with ``settings`` as the job's own trainer settings (and the flags they render)."""
    return _spec(trainer_settings=settings, trainer_args=trainer_flags(settings), **changes)


# ---------------------------------------------------------------- payloads


def test_job_runs_on_the_pool_and_is_created_with_noaction():
    job = job_options(SPEC)
    assert isinstance(job, m.BatchJobCreateOptions)
    assert job.id == SPEC.job_id and job.pool_info.pool_id == "ib-gpu"
    # A job without tasks counts as complete: terminatejob only after the task is added.
    assert job.all_tasks_complete_mode == "noaction"
    assert job.job_preparation_task is None
    assert {item.name: item.value for item in job.metadata} == {
        "stack": "vision-prod",
        "run": SPEC.run_name,
    }
    assert job.as_dict()["poolInfo"] == {"poolId": "ib-gpu"}  # the wire format Batch receives


def test_task_is_multi_instance_with_infiniband_container_options_and_no_gpus_flag():
    task = task_options(SPEC)
    assert isinstance(task, m.BatchTaskCreateOptions) and task.id == TASK_ID
    assert task.multi_instance_settings.number_of_instances == 4
    container = task.container_settings
    assert container.image_name == SPEC.image_ref
    options = container.container_run_options.split()
    for option in ("--network", "--ipc", "--ulimit", "--device", "--cap-add", "--shm-size"):
        assert option in options
    # Batch exposes the GPUs itself; it documents not passing --gpus.
    assert not any(option.startswith("--gpus") for option in options)
    # ND H100 v5: its local NVMe array's mount point too (infra.batch.NVME_ROOT).
    assert container.container_run_options == f"{CONTAINER_RUN_OPTIONS} {NVME_BIND}"
    assert container.registry.registry_server == "visionacr.azurecr.io"
    assert container.registry.identity_reference.resource_id == SPEC.node_identity_id
    assert {b.source for b in container.container_host_batch_bind_mounts} == {
        "Task",
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


def test_job_ids_change_with_any_input_and_checkpoints_follow_the_training_settings():
    new_image = _spec(image_ref=SPEC.image_ref.replace("a", "b"))
    assert new_image.job_id != SPEC.job_id
    assert new_image.run_name == SPEC.run_name  # new code resumes the same run
    more_epochs = _trained((("epochs", "100"),))
    assert more_epochs.run_name != SPEC.run_name
    assert len(SPEC.job_id) <= 64


def test_the_trainer_command_carries_the_sizes_preflight_floor_unless_it_sets_one():
    """The job builds the whole command (``pulumi preview`` shows it); the launcher runs it."""
    cpu = trainer_command(_spec(vm_size="Standard_D2ds_v5"))
    assert "--preflight-min-busbw" not in cpu  # no bandwidth floor without IB
    unknown = trainer_command(_spec(vm_size="Standard_Unknown_v9"))  # an older stack's size
    assert "--preflight-min-busbw" not in unknown
    assert trainer_command(_spec(vm_size="Standard_ND96asr_v4"))[-2:] == [
        "--preflight-min-busbw",
        "126.0",
    ]
    own = _trained((("preflight_min_busbw", "10"),), vm_size="Standard_ND96asr_v4")
    assert trainer_command(own).count("--preflight-min-busbw") == 1  # an explicit floor wins
    assert "10" in trainer_command(own) and "126.0" not in trainer_command(own)
    assert trainer_command(SPEC)[-2:] == ["--preflight-min-busbw", "245.0"]
    assert "--preflight-min-busbw" not in trainer_command(_spec(vm_size="Standard_D2ds_v5"))
    with_own = _trained((("preflight_min_busbw", "0"),))
    assert trainer_command(with_own).count("--preflight-min-busbw") == 1


# ---------------------------------------------------------------- command lines, executed


def test_the_image_parser_follows_docker_rules(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        'FROM builder AS build\nENTRYPOINT ["/build.sh"]\nFROM base\n'
        'SHELL ["/bin/bash", "-c"]\nENTRYPOINT /entry.sh \\\n  --flag\nCMD ["run"]\n'
    )
    entrypoint, cmd = image_command(dockerfile)
    assert entrypoint[:2] == ["/bin/bash", "-c"] and entrypoint[2].split() == [
        "/entry.sh",
        "--flag",
    ]
    assert cmd == ["run"]
    assert container_argv("a 'b c'", dockerfile)[-2:] == ["a", "b c"]
    dockerfile.write_text('FROM base\nCMD ["python"]\n')
    with pytest.raises(AssertionError, match="sets no ENTRYPOINT"):
        image_command(dockerfile)
    dockerfile.write_text('FROM base\nCMD ["python"]\nENTRYPOINT []\n')
    assert image_command(dockerfile) == ([], ["python"])


@pytest.fixture
def node(tmp_path):
    """A primary node's Batch environment with a stub ``python`` that records what ran."""
    record = tmp_path / "ran.jsonl"
    stub_program(tmp_path / "bin" / "python", record)
    workdir = tmp_path / "wd"
    workdir.mkdir()
    env = {
        "PATH": f"{tmp_path / 'bin'}:{base_path()}",
        "AZ_BATCH_NODE_MOUNTS_DIR": str(tmp_path / "fsmounts"),
        "AZ_BATCH_NODE_SHARED_DIR": str(tmp_path / "shared"),
        "AZ_BATCH_TASK_WORKING_DIR": str(workdir),
        "AZ_BATCH_HOST_LIST": "10.0.0.4,10.0.0.5",
        "AZ_BATCH_MASTER_NODE": "10.0.0.4:6000",
        "AZ_BATCH_IS_CURRENT_NODE_MASTER": "true",
        "AZ_BATCH_JOB_ID": SPEC.job_id,
    }
    return env, workdir, record, tmp_path


def _run(node, command_line: str) -> list[str]:
    env, workdir, record, _ = node
    result = run_in_container(command_line, env, workdir)
    assert result.returncode == 0, result.stderr
    (argv,) = recorded(record)
    record.unlink()
    return argv


def test_the_image_without_a_command_runs_its_cmd(node):
    assert _run(node, "") == ["-m", "trainer", "--help"]


def test_coordination_and_application_commands_run_the_launcher_on_the_trainer(node):
    tmp_path = node[3]
    task = task_options(SPEC)
    output_dir = f"{tmp_path}/fsmounts/shared/runs/vision-prod/{SPEC.run_name}"
    trainer = [
        "python",
        "-m",
        "trainer",
        *SPEC.trainer_args,
        "--backend",
        "horovod",
        "--output-dir",
        output_dir,
        "--metrics-upload-url",
        f"{SPEC.log_url}live/",
        "--outputs-url",
        f"{SPEC.blob_endpoint}outputs/{SPEC.job_id}/",
        "--checkpoint-mirror-url",  # the checkpoints container, under the run folder's path
        f"{SPEC.blob_endpoint}checkpoints/vision-prod/{SPEC.run_name}/",
        "--preflight-min-busbw",  # the H100 size's floor: 70% of its 350 GB/s baseline
        "245.0",
    ]
    coordination = _run(node, task.multi_instance_settings.coordination_command_line)
    launch = ["-m", "trainer.launch", "--vm-size", "Standard_ND96isr_H100_v5"]
    # The launcher is told the engine and the run folder: the trainer's own, from one mapping.
    launch += ["--backend", "horovod", "--run-dir", output_dir]
    assert coordination == [
        *launch, "--defer-exit-code", "--watch-scheduled-events", "--", *trainer
    ]  # fmt: skip
    application = _run(node, task.command_line)
    assert application == [*launch, "--report", "--", *trainer]
    for argv in (coordination, application):
        args = launch_parser().parse_args(argv[2:])  # what trainer.launch will accept
        assert str(args.run_dir) == output_dir and args.backend == "horovod"
        request = parse(args.command[3:])  # and the trainer
        assert request.config.backend == "horovod" and request.config.fp16_allreduce
        assert request.config.output_dir == output_dir
        assert request.config.preflight_min_busbw == 245.0
        assert request.config.outputs_url == SPEC.outputs_url  # where fetch reads the results


def test_the_cpu_acceptance_size_gets_no_infiniband_device_or_hpc_mount(node):
    """Docker refuses a --device that the node lacks; a D-series node has no /dev/infiniband."""
    spec = _spec(vm_size="Standard_D2ds_v5", node_count=2)
    task = task_options(spec)
    options = task.container_settings.container_run_options
    assert options == CPU_CONTAINER_RUN_OPTIONS
    assert "--device" not in options and "/dev/infiniband" not in options
    assert "/opt/microsoft" not in options and "--gpus" not in options
    for option in ("--network host", "--ipc host", "--ulimit memlock=-1"):
        assert option in options  # the launchers still meet on the nodes' addresses
    a100 = task_options(_spec(vm_size="Standard_ND96asr_v4")).container_settings
    assert a100.container_run_options == CONTAINER_RUN_OPTIONS
    # The commands run the launcher with the CPU size, which it accepts (one worker per node).
    coordination = _run(node, task.multi_instance_settings.coordination_command_line)
    assert coordination[:4] == ["-m", "trainer.launch", "--vm-size", "Standard_D2ds_v5"]
    args = launch_parser().parse_args(coordination[2:])
    assert args.vm_size == "Standard_D2ds_v5" and args.defer_exit_code
    assert "--preflight-min-busbw" not in coordination


# python on a CPU node: the real one, except that a worker ("python -m trainer ...") records its
# rank, how many NCCL variables it got, and its arguments.
CPU_WORKER_STUB = """#!/bin/bash
if [ "$1" = -m ] && [ "$2" = trainer ]; then
    echo "$HOROVOD_RANK/$HOROVOD_SIZE $HOROVOD_CPU_OPERATIONS nccl=$(env | grep -c '^NCCL_') $*" \\
        >> "$WORKERS_RAN"
    exit 0
fi
exec %s "$@"
"""


def test_a_cpu_node_runs_one_gloo_worker_without_nccl_or_a_preflight_floor(tmp_path):
    """The CPU size's task command lines run as a node runs them, the launcher for real."""
    from tests.trainer.launch.launch_nodes import free_port, held_port

    spec = _trained((("model", "tiny"),), vm_size="Standard_D2ds_v5", node_count=1)
    task = task_options(spec)
    with held_port() as batch_port:
        env, workdir, ran = one_node_pool(
            tmp_path, CPU_WORKER_STUB, spec.job_id, batch_port, free_port()
        )
        coordination = run_in_container(
            task.multi_instance_settings.coordination_command_line, env, workdir
        )
        assert coordination.returncode == 0, coordination.stderr
        report = run_in_container(task.command_line, env, workdir)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "every node finished" in report.stdout.splitlines()[-1]
    assert "node 1/1: starting 1 worker(s)" in report.stdout
    (worker,) = ran.read_text().splitlines()
    assert worker.startswith("0/1 gloo nccl=0 -m trainer --model tiny --backend horovod")
    assert "--preflight-min-busbw" not in worker


def _trainer_file(tmp_path, text: str):
    """A stack's trainer settings file, read and validated as the stack reads it."""
    from infra.trainer_settings import TrainerSettings

    path = tmp_path / "trainer.yaml"
    path.write_text(text, encoding="utf-8")
    return TrainerSettings.read(path.name, tmp_path)


def _spec_of(settings, **changes) -> JobSpec:
    from infra.trainer_settings import job_settings

    return _trained(job_settings(settings), **changes)


def test_a_stack_that_chooses_ddp_runs_the_launcher_on_a_ddp_trainer(node):
    """The trainer settings choose the engine; the job passes it once, where both the launcher
    (which starts that engine's workers) and the trainer read it."""
    tmp_path = node[3]
    spec = _spec_of(_trainer_file(tmp_path, "model: resnet50\nbackend: ddp\nbatch_size: 256\n"))
    task = task_options(spec)
    coordination = _run(node, task.multi_instance_settings.coordination_command_line)
    application = _run(node, task.command_line)
    for argv in (coordination, application):
        args = launch_parser().parse_args(argv[2:])
        trainer = args.command
        assert trainer[:3] == ["python", "-m", "trainer"]
        assert trainer[3:9] == ["--model", "resnet50", "--backend", "ddp", "--batch-size", "256"]
        assert trainer.count("--backend") == 1 and "horovod" not in trainer
        assert args.backend == "ddp"  # what the launcher starts
        assert parse(trainer[3:]).config.backend == "ddp"  # what the trainer runs
    # A new engine is a new job and a new run (an engine's checkpoints belong to its run).
    horovod = _spec_of(_trainer_file(tmp_path, "model: resnet50\nbatch_size: 256\n"))
    assert spec.job_id != horovod.job_id and spec.run_name != horovod.run_name


def test_a_stack_that_chooses_no_engine_or_horovod_keeps_todays_command_line_and_ids(tmp_path):
    """Existing stacks: no replaced job, no new run folder, the same command line."""
    unset = _spec_of(_trainer_file(tmp_path, "model: resnet50\nbatch_size: 256\n"))
    named = _spec_of(
        _trainer_file(tmp_path, "model: resnet50\nbackend: horovod\nbatch_size: 256\n")
    )
    assert (
        unset.trainer_args == named.trainer_args == ("--model", "resnet50", "--batch-size", "256")
    )
    assert (unset.job_id, unset.run_name) == (named.job_id, named.run_name)
    command = trainer_command(named)
    assert command[:9] == [
        "python", "-m", "trainer", "--model", "resnet50", "--batch-size", "256",
        "--backend", "horovod",
    ]  # fmt: skip
    assert command == trainer_command(unset) and command.count("--backend") == 1


def test_a_stack_that_chooses_backend_local_is_refused_in_one_line(tmp_path):
    from infra.settings.checks import ConfigError
    from infra.settings.jobs import job_settings

    path = tmp_path / "local.yaml"
    path.write_text("model: tiny\nbackend: local\n", encoding="utf-8")
    values = {"jobs": {"small": {"trainerConfig": str(path)}}, "node_count": 2}
    with pytest.raises(ConfigError) as refused:
        job_settings(values, {"jobs"})
    message = str(refused.value)
    assert message.startswith(f"jobs.small.trainerConfig={path}: backend=local: ")
    assert "set backend to one of them" in message and "horovod, ddp, fsdp" in message
    assert "\n" not in message


# python on a CPU node, for a ddp job: a worker records the torch.distributed variables it got.
DDP_WORKER_STUB = """#!/bin/bash
if [ "$1" = -m ] && [ "$2" = trainer ]; then
    echo "$RANK/$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE node=$GROUP_RANK" \\
        "master=$MASTER_ADDR:$MASTER_PORT hvd=${HOROVOD_RANK:-none} $*" >> "$WORKERS_RAN"
    exit 0
fi
exec %s "$@"
"""


def test_a_cpu_node_starts_a_ddp_jobs_worker_the_torchrun_way(tmp_path):
    """The ddp job's task command lines run as a node runs them, the launcher for real: its
    worker gets torch.distributed's variables, MASTER_PORT beside the launcher's own port."""
    from tests.trainer.launch.launch_nodes import free_port, held_port

    trainer = _trainer_file(tmp_path, "model: tiny\nbackend: ddp\n")
    spec = _spec_of(trainer, vm_size="Standard_D2ds_v5", node_count=1)
    task = task_options(spec)
    rendezvous = free_port()
    with held_port() as batch_port:
        env, workdir, ran = one_node_pool(
            tmp_path, DDP_WORKER_STUB, spec.job_id, batch_port, rendezvous
        )
        coordination = run_in_container(
            task.multi_instance_settings.coordination_command_line, env, workdir
        )
        assert coordination.returncode == 0, coordination.stderr
        report = run_in_container(task.command_line, env, workdir)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "starting 1 worker(s) (attempt " in report.stdout
    assert f", ddp on 127.0.0.1:{rendezvous + 1}" in report.stdout
    assert "every node finished" in report.stdout.splitlines()[-1]
    (worker,) = ran.read_text().splitlines()
    assert worker.startswith(
        f"0/1 local=0/1 node=0 master=127.0.0.1:{rendezvous + 1} hvd=none "
        "-m trainer --model tiny --backend ddp --output-dir "
    )


def test_staging_command_runs_trainer_data_stage_and_never_the_prefix(node):
    env, workdir, _, _ = node
    prefix = "imagenet 2012/$(touch pwned)`touch pwned2`'\"${HOME}"
    # A size without local NVMe disks stages on the temporary disk (test_nvme_staging.py).
    spec = _spec(dataset_prefix=prefix, vm_size="Standard_ND96asr_v4")
    prep = job_options(spec).job_preparation_task
    assert prep is not None and prep.wait_for_success is True
    argv = _run(node, prep.command_line)
    dest = f"{workdir}/datasets/{prefix}"  # the preparation's AZ_BATCH_TASK_WORKING_DIR
    assert argv == [
        "-m",
        "trainer.data",
        "stage",
        "--account-url",
        "https://visiondata.blob.core.windows.net/",
        "--container",
        "datasets",
        "--prefix",
        prefix,
        "--dest",
        dest,
    ]
    assert not list(workdir.iterdir())  # nothing in the prefix was executed
    from trainer.data.__main__ import build_parser as data_parser

    args = data_parser().parse_args(argv[2:])
    assert (args.command, args.prefix, str(args.dest)) == ("stage", prefix, dest)
    # The task reads the same folder, named by the variable Batch gives the job's other tasks.
    env["AZ_BATCH_JOB_PREP_WORKING_DIR"] = str(workdir)
    argv = _run(node, task_options(spec).command_line)
    assert argv[argv.index("--data") + 1] == "shards"
    assert argv[argv.index("--data-dir") + 1] == dest


# ---------------------------------------------------------------- provider against a fake Batch


class StaticToken:
    def get_token(self, *scopes, **kwargs):
        return AccessToken("fake-token", int(time.time()) + 3600)


@pytest.fixture
def batch(tmp_path, monkeypatch):
    """A fake Batch account; the provider's own client (the real SDK) talks to it over TLS."""
    fake = FakeBatch(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(fake.ca_path))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr(credentials, "credential", StaticToken)
    monkeypatch.setattr(calls_module, "FIRST_AUTH_RETRY_SECONDS", 0.01)
    monkeypatch.setattr(calls_module, "AUTH_RETRY_SECONDS", 0.1)
    monkeypatch.setattr(job_module, "POLL_SECONDS", 0)
    monkeypatch.setattr(calls_module, "NOT_FOUND_PAUSE_SECONDS", 0)
    batch_module.client.cache_clear()
    yield fake
    fake.close()
    batch_module.client.cache_clear()


def _at(fake: FakeBatch) -> JobSpec:
    return _spec(endpoint=fake.url)


def _props(fake: FakeBatch) -> dict:
    return {**_at(fake).__dict__, "trainer_args": list(SPEC.trainer_args)}


def _job_calls(fake: FakeBatch, job_id: str) -> list[str]:
    return [call for call in fake.calls() if job_id in call or call == "POST /jobs"]


def test_create_adds_the_job_with_noaction_then_its_task_then_terminatejob(batch):
    result = TrainingJobProvider().create(_props(batch))
    job_id = _at(batch).job_id
    assert result.id == job_id
    assert _job_calls(batch, job_id) == [
        "POST /jobs",
        f"POST /jobs/{job_id}/tasks",
        f"PATCH /jobs/{job_id}",
        f"GET /jobs/{job_id}",
    ]
    create, task, update = batch.requests[:3]
    assert create.body["onAllTasksComplete"] == "noaction"
    assert task.body["id"] == TASK_ID
    assert update.body == {"onAllTasksComplete": "terminatejob"}
    assert batch.jobs[job_id]["onAllTasksComplete"] == "terminatejob"
    assert result.outs["state"] == "active"
    assert result.outs["log_url"] == f"https://visiondata.blob.core.windows.net/logs/{job_id}/"
    assert result.outs["checkpoint_path"] == f"shared/runs/vision-prod/{SPEC.run_name}"


# Pulumi's engine hands a dynamic provider every number as a float: create's props come through
# protobuf's Struct, whose numbers are doubles (pulumi.runtime.rpc.deserialize_properties); a
# stack's state file, read back as JSON (the sweep's --state-file), has ints.
def _engine_props(fake: FakeBatch, priority: float) -> dict:
    return {**_props(fake), "node_count": float(SPEC.node_count), "priority": priority}


def test_a_priority_the_engine_hands_over_as_a_float_reaches_batch_as_an_int32(batch):
    job_id = TrainingJobProvider().create(_engine_props(batch, 5.0)).id
    (create,) = [r for r in batch.requests if r.method == "POST" and r.path == "/jobs"]
    assert create.body["priority"] == 5 and type(create.body["priority"]) is int
    assert job_id == _spec(endpoint=batch.url, priority=5).job_id
    # The payload built with azure-batch's own models, as the SDK serializes it.
    wire = job_options(JobSpec.from_props(_engine_props(batch, 0.0))).as_dict()["priority"]
    assert wire == 0 and type(wire) is int


def test_the_job_id_is_the_same_for_a_float_or_an_int_priority_and_unchanged_for_ints():
    props = {**SPEC.__dict__, "trainer_args": list(SPEC.trainer_args)}
    for priority in (5, -3, 1000):
        as_int = JobSpec.from_props({**props, "priority": priority})
        assert JobSpec.from_props({**props, "priority": float(priority)}).job_id == as_int.job_id
    # The ids jobs whose priority arrived as an int have always had (computed before the
    # change), and priority 0 (the default) is left out of the id in either form.
    assert JobSpec.from_props({**props, "priority": 5}).job_id == "vision-prod-e5377b5e05"
    assert JobSpec.from_props({**props, "priority": 0.0}).job_id == "vision-prod-03023df92e"
    assert SPEC.job_id == "vision-prod-03023df92e"
    # A deployed job keeps its id whichever form its priority came in: the diff compares the
    # inputs (5.0 == 5), not a recomputed id, so nothing is replaced.
    olds = {**props, "priority": 5.0, "state": "active", "job_id": "recorded-id"}
    diff = TrainingJobProvider().diff("recorded-id", olds, {**props, "priority": 5})
    assert diff.changes is False


@pytest.mark.parametrize("priority", [2.5, float("nan"), 1001.0, "5", None, True])
def test_a_priority_that_is_not_a_batch_priority_is_refused_in_one_line(priority):
    props = {**SPEC.__dict__, "trainer_args": list(SPEC.trainer_args), "priority": priority}
    message = rf"^priority={re.escape(repr(priority))}: a Batch job priority is a whole number"
    with pytest.raises(ValueError, match=message) as e:
        JobSpec.from_props(props)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("failing", ["tasks", "update"])
def test_a_rejected_task_or_update_deletes_the_job_it_left(batch, failing):
    job_id = _at(batch).job_id
    if failing == "tasks":
        batch.fail("POST", f"/jobs/{job_id}/tasks", 400, "InvalidPropertyValue")
    else:
        batch.fail("PATCH", f"/jobs/{job_id}", 400, "InvalidPropertyValue")
    with pytest.raises(
        JobError, match=r"at https://127\.0\.0\.1:\d+ failed: \(InvalidPropertyValue"
    ):
        TrainingJobProvider().create(_props(batch))
    assert f"DELETE /jobs/{job_id}" in batch.calls()
    assert job_id not in batch.jobs


def test_authorization_failures_are_retried_with_backoff_and_logged(batch, monkeypatch):
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warnings.append(message))
    monkeypatch.setattr(calls_module, "AUTH_RETRY_SECONDS", 10.0)
    batch.fail("POST", "/jobs", 403, "AuthorizationFailure", times=2)
    batch.fail("POST", f"/jobs/{_at(batch).job_id}/tasks", 401, "InvalidAuthenticationToken")
    assert TrainingJobProvider().create(_props(batch)).id == _at(batch).job_id
    assert [w.split(":")[-1].strip() for w in warnings] == [
        "retrying in 0.01 s",
        "retrying in 0.02 s",
        "retrying in 0.01 s",
    ]
    assert "refused to create job" in warnings[0] and "(403 AuthorizationFailure)" in warnings[0]


def test_authorization_that_never_comes_fails_with_one_line_naming_the_fix(batch):
    batch.fail("POST", "/jobs", 403, "AuthorizationFailure", times=100)
    with pytest.raises(JobError) as failure:
        TrainingJobProvider().create(_props(batch))
    message = str(failure.value)
    assert "\n" not in message
    assert "refused to create job" in message and "Azure Batch Job Submitter" in message
    assert batch.calls().count("POST /jobs") > 2  # it did retry


def test_any_input_change_replaces_the_job_delete_first():
    provider = TrainingJobProvider()
    props = {**SPEC.__dict__, "trainer_args": list(SPEC.trainer_args)}
    olds = {**props, "state": "active", "job_id": SPEC.job_id}
    same = provider.diff(SPEC.job_id, olds, props)
    assert same.changes is False
    new_provider_code = {**props, "__provider": "a different serialization"}
    assert (
        provider.diff(SPEC.job_id, {**olds, "__provider": "x"}, new_provider_code).changes is False
    )
    changed = provider.diff(SPEC.job_id, olds, {**props, "node_count": 8})
    assert changed.changes is True and changed.replaces == ["node_count"]
    assert changed.delete_before_replace is True


def _old_state(fake: FakeBatch) -> dict:
    """Outputs written by an older provider: fields JobSpec has now are missing, another is
    there that it never had."""
    props = _props(fake)
    for key in ("dataset_prefix", "node_identity_client_id", "blob_endpoint"):
        del props[key]
    return {**props, "retired_setting": 1, "job_id": SPEC.job_id, "state": "active"}


def test_read_of_old_state_refreshes_the_state_and_forgets_deleted_jobs(batch):
    batch.add_job(SPEC.job_id, "completed")
    result = TrainingJobProvider().read(SPEC.job_id, _old_state(batch))
    assert result.id == SPEC.job_id and result.outs["state"] == "completed"
    assert result.outs["retired_setting"] == 1
    assert TrainingJobProvider().read("gone", _old_state(batch)).id is None


def test_read_reports_the_tasks_live_state_and_retries(batch):
    """A refresh (every `pulumi up` and preview: Pulumi.yaml sets refresh: always) shows the
    job's and its task's state and how often Batch retried the task."""
    batch.add_job(SPEC.job_id, "active")
    batch.tasks[SPEC.job_id] = [{"id": TASK_ID, "commandLine": "true"}]
    batch.task_retries = 2
    outs = TrainingJobProvider().read(SPEC.job_id, _old_state(batch)).outs
    assert (outs["state"], outs["task_state"], outs["retries"]) == ("active", "running", 2)
    batch.tasks[SPEC.job_id] = []  # a job without its task: the job's state only
    outs = TrainingJobProvider().read(SPEC.job_id, _old_state(batch)).outs
    assert outs["state"] == "active" and "task_state" not in outs


def test_delete_of_old_state_terminates_a_running_job_then_deletes_it(batch):
    batch.add_job(SPEC.job_id, "active")
    TrainingJobProvider().delete(SPEC.job_id, _old_state(batch))
    job_id = SPEC.job_id
    calls = batch.calls()
    assert calls.index(f"POST /jobs/{job_id}/terminate") < calls.index(f"DELETE /jobs/{job_id}")
    terminate = next(r for r in batch.requests if r.path.endswith("/terminate"))
    assert terminate.body == {"terminateReason": "UserTerminate"}
    assert calls[-1] == f"GET /jobs/{job_id}"  # confirmed gone (404)
    assert job_id not in batch.jobs


def test_delete_of_a_finished_or_missing_job_succeeds(batch):
    batch.add_job("finished", "completed")
    TrainingJobProvider().delete("finished", _old_state(batch))
    assert "POST /jobs/finished/terminate" not in batch.calls()
    assert "DELETE /jobs/finished" in batch.calls() and "finished" not in batch.jobs
    TrainingJobProvider().delete("missing", _old_state(batch))
    assert "DELETE /jobs/missing" not in batch.calls()


def test_a_failed_delete_poll_is_surfaced_not_swallowed(batch):
    batch.add_job("stuck", "completed")

    def poll_fails(request, fake):
        deleted = "DELETE /jobs/stuck" in fake.calls()
        if deleted and request.method == "GET" and request.path == "/jobs/stuck":
            return 400, "InvalidPropertyValue"
        return None

    batch.faults.append(poll_fails)
    with pytest.raises(JobError, match=r"read job stuck at .* failed: .*InvalidPropertyValue"):
        TrainingJobProvider().delete("stuck", _old_state(batch))


def test_a_job_still_there_after_its_delete_is_an_error(batch, monkeypatch):
    monkeypatch.setattr(job_module, "DELETE_WAIT_SECONDS", 0.0)
    monkeypatch.setattr(job_module, "POLL_SECONDS", 1)  # the SDK's poller thread keeps polling
    batch.add_job("sticky", "completed")

    def keep(request, fake):
        if request.method == "DELETE":
            fake.jobs["sticky"]["state"] = "deleting"
            return 202, None
        return None

    batch.faults.append(keep)
    with pytest.raises(JobError, match=r"job sticky .* is still deleting after its delete"):
        TrainingJobProvider().delete("sticky", _old_state(batch))


# ---------------------------------------------------------------- an eventually consistent Batch
# Batch documents no consistency window: the fake takes the unfavourable reading of each race
# (tests/support/fake_batch.py), and the provider must neither delete nor orphan a job over it.


def _made_before(fake: FakeBatch, state: str, with_task: bool, spec: JobSpec | None = None):
    """A job an earlier `pulumi up` made with these inputs and never recorded (its create
    failed after the job add): the same id and fields."""
    spec = spec or _at(fake)
    fake.jobs[spec.job_id] = {**job_options(spec).as_dict(), "state": state}
    if with_task:
        fake.tasks[spec.job_id] = [task_options(spec).as_dict()]
    return spec.job_id


def _warnings(monkeypatch) -> list[str]:
    said: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: said.append(message))
    return said


def test_a_job_batch_does_not_show_yet_gets_its_task_and_is_kept(batch):
    batch.invisible_after_create = 2  # the task add and its first retry meet JobNotFound
    result = TrainingJobProvider().create(_props(batch))
    job_id = _at(batch).job_id
    assert result.id == job_id and result.outs["state"] == "active"
    assert f"DELETE /jobs/{job_id}" not in batch.calls()
    assert [t["id"] for t in batch.tasks[job_id]] == [TASK_ID]
    assert batch.jobs[job_id]["onAllTasksComplete"] == "terminatejob"


def test_a_job_add_whose_answer_was_lost_adopts_the_job_it_made(batch):
    batch.commit_then_fail("POST", "/jobs")  # 503 after the commit: the SDK sends it again
    result = TrainingJobProvider().create(_props(batch))
    job_id = _at(batch).job_id
    assert batch.calls().count("POST /jobs") == 2  # the SDK's own retry met JobExists
    assert result.id == job_id and f"DELETE /jobs/{job_id}" not in batch.calls()
    assert [t["id"] for t in batch.tasks[job_id]] == [TASK_ID]
    assert batch.jobs[job_id]["onAllTasksComplete"] == "terminatejob"


def test_a_task_add_whose_answer_was_lost_keeps_the_task_it_made(batch):
    batch.commit_then_fail("POST", f"/jobs/{_at(batch).job_id}/tasks")
    result = TrainingJobProvider().create(_props(batch))
    assert [t["id"] for t in batch.tasks[result.id]] == [TASK_ID]
    assert f"DELETE /jobs/{result.id}" not in batch.calls()


@pytest.mark.parametrize("state", ["active", "disabled"])
def test_a_job_an_older_create_left_without_its_task_is_completed_and_adopted(batch, state):
    job_id = _made_before(batch, state, with_task=False)
    result = TrainingJobProvider().create(_props(batch))
    assert result.id == job_id and f"DELETE /jobs/{job_id}" not in batch.calls()
    assert [t["id"] for t in batch.tasks[job_id]] == [TASK_ID]
    assert batch.jobs[job_id]["onAllTasksComplete"] == "terminatejob"


def test_a_job_an_older_create_left_that_ran_is_adopted_as_it_is(batch, monkeypatch):
    said = _warnings(monkeypatch)
    job_id = _made_before(batch, "completed", with_task=True)
    result = TrainingJobProvider().create(_props(batch))
    assert result.id == job_id and result.outs["state"] == "completed"
    assert f"DELETE /jobs/{job_id}" not in batch.calls()  # its record and task files stay
    assert f"POST /jobs/{job_id}/tasks" not in batch.calls()
    assert any(job_id in line and "already ran" in line and "--replace" in line for line in said)


def test_a_job_an_older_create_ended_before_its_task_is_made_again(batch):
    job_id = _made_before(batch, "completed", with_task=False)
    result = TrainingJobProvider().create(_props(batch))
    calls = batch.calls()
    assert result.id == job_id and result.outs["state"] == "active"
    assert calls.index(f"DELETE /jobs/{job_id}") < len(calls) - 1 - calls[::-1].index("POST /jobs")
    assert [t["id"] for t in batch.tasks[job_id]] == [TASK_ID]


def test_a_job_still_being_deleted_under_the_id_is_waited_out(batch):
    job_id = _made_before(batch, "completed", with_task=True)
    # An older delete of this id (a destroy that gave up waiting) that is not done yet.
    batch.transition(job_id, "deleting", 3, None)
    result = TrainingJobProvider().create(_props(batch))
    assert result.id == job_id and result.outs["state"] == "active"
    assert [t["id"] for t in batch.tasks[job_id]] == [TASK_ID]


def test_a_job_of_another_owner_under_the_id_is_left_alone_and_named(batch):
    other = _spec(endpoint=batch.url, stack="someone-else")
    job_id = _at(batch).job_id
    batch.jobs[job_id] = {**job_options(other).as_dict(), "id": job_id, "state": "active"}
    with pytest.raises(JobError) as failure:
        TrainingJobProvider().create(_props(batch))
    message = str(failure.value)
    assert "\n" not in message and job_id in message and "stack=someone-else" in message
    assert f"DELETE /jobs/{job_id}" not in batch.calls() and job_id in batch.jobs


def test_a_failed_create_deletes_its_job_even_while_batch_does_not_show_it(batch):
    job_id = _at(batch).job_id
    batch.fail("POST", f"/jobs/{job_id}/tasks", 400, "InvalidPropertyValue")
    batch.fail("GET", f"/jobs/{job_id}", 404, "JobNotFound", times=2)  # the cleanup's reads
    with pytest.raises(JobError, match="InvalidPropertyValue"):
        TrainingJobProvider().create(_props(batch))
    assert f"DELETE /jobs/{job_id}" in batch.calls() and job_id not in batch.jobs


def test_a_refresh_right_after_create_keeps_the_job(batch):
    created = TrainingJobProvider().create(_props(batch))
    batch.hide(created.id, 2)  # the refresh's first reads reach a replica without it
    read = TrainingJobProvider().read(created.id, created.outs)
    assert read.id == created.id and read.outs["state"] == "active"
    assert TrainingJobProvider().read("gone", created.outs).id is None  # still forgets


def test_delete_meets_a_terminate_already_under_way_and_waits_for_it(batch):
    batch.add_job(SPEC.job_id, "active")
    job_id = SPEC.job_id

    def cancelled_meanwhile(request, fake):
        # `ops cancel` terminated the job between the delete's read and its terminate.
        terminate = request.method == "POST" and request.path.endswith("/terminate")
        if terminate and fake.jobs[job_id]["state"] == "active":
            fake.transition(job_id, "terminating", 2, "completed")
        return None

    batch.faults.append(cancelled_meanwhile)
    TrainingJobProvider().delete(job_id, _old_state(batch))
    assert batch.calls().count(f"POST /jobs/{job_id}/terminate") == 1
    assert f"DELETE /jobs/{job_id}" in batch.calls() and job_id not in batch.jobs


def test_a_second_terminate_while_the_first_runs_waits_for_it(batch):
    batch.add_job("cancelled", "active")
    batch.terminating_reads = 2
    batch.transition("cancelled", "terminating", 2, "completed")  # a first cancel
    batch_module.terminate_job(batch_module.client(batch.url), "cancelled", poll_seconds=0)
    assert batch.jobs["cancelled"]["state"] == "completed"
