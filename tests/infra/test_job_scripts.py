"""A job that runs its own command (``jobs.<name>.command``, docs/jobs.md, Your own script): the
setting read as a stack file gives it, the job's inputs under Pulumi's mocks, the offline plan,
what replaces it, and its task's command lines run as a node runs them (bash, Batch's
variables, the launcher for real, a stub ``python`` recording what each worker got)."""

from __future__ import annotations

import json

import pytest

from dt_commands.plan import evaluate, render
from infra.batch import task_options, trainer_command
from infra.batch_calls import JobError
from infra.job import TrainingJobProvider
from infra.job_spec import JobSpec
from infra.settings.checks import ConfigError
from infra.settings.jobs import job_settings
from tests.infra.test_job_payloads import SPEC
from tests.support.container import one_node_pool, run_in_container
from tests.support.stacks import CLIENT_IP, dt_plan_of_jobs, of_type, stack_values

JOB = "pulumi-python:dynamic:Resource"
MINE = {"command": "python train.py --steps 40 --note 'two words'", "nodes": 1}


def _jobs(entry: dict) -> tuple:
    """The job ``entry`` describes; a command's train.py comes in the example's code folder."""
    with_code = {"code": "examples/torchrun_ddp", **entry} if "command" in entry else entry
    return job_settings({"jobs": {"mine": with_code}, "node_count": 2}, {"jobs"})


def test_a_command_string_is_split_into_words_as_a_shell_would_and_never_run_by_one():
    (job,) = _jobs({"command": "python train.py --note 'two words' $HOME;rm -rf /"})
    assert job.trainer is None and job.engine == "torch"  # the default engine
    assert job.command == ("python", "train.py", "--note", "two words", "$HOME;rm", "-rf", "/")
    (listed,) = _jobs({"command": ["python", "train.py"], "engine": "horovod"})
    assert (listed.command, listed.engine) == (("python", "train.py"), "horovod")


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            {"command": "python train.py", "trainerConfig": "trainer/presets/demo.yaml"},
            "jobs.mine: command and trainerConfig are both set: a job runs either the trainer "
            "or your command; remove jobs.mine.trainerConfig or jobs.mine.command",
        ),
        (
            {"command": "python train.py", "engine": "mpi"},
            "jobs.mine.engine='mpi': choose torch or horovod (torch: torchrun's variables, for "
            "torch.distributed, Accelerate or Lightning scripts; horovod: horovodrun's, for a "
            "Horovod script)",
        ),
        (
            {"trainerConfig": "trainer/presets/demo.yaml", "engine": "torch"},
            "jobs.mine.engine='torch': only a job with a command chooses its engine (the "
            "trainer's comes from its trainerConfig's backend); remove it",
        ),
        (
            {"command": "python 'train.py"},
            'jobs.mine.command="python \'train.py": cannot split it into words (No closing '
            "quotation); close the quote",
        ),
        ({"command": "  "}, "jobs.mine.command='  ': empty; give the program and its arguments"),
        ({"command": ["python", 3]}, "jobs.mine.command=['python', 3]: give a list of strings"),
        ({"nodes": 1}, "jobs.mine.trainerConfig: required (a trainer YAML path), or give"),
    ],
)
def test_bad_command_settings_are_one_line_naming_the_setting_and_the_fix(entry, expected):
    with pytest.raises(ConfigError) as refused:
        _jobs(entry)
    assert str(refused.value).startswith(expected)
    assert "\n" not in str(refused.value)


def _stack(jobs: dict) -> dict:
    """The dev stack with ``jobs``; a command job's script comes in its code folder
    (infra.runnable), whose upload needs the deployer's address admitted."""
    code = {name: {"code": "examples/torchrun_ddp", **job} for name, job in jobs.items()}
    with_code = {name: job if "trainerConfig" in job else code[name] for name, job in jobs.items()}
    return {
        **stack_values("dev"),
        "gpu-cluster:jobs": json.dumps(with_code),
        "gpu-cluster:storageAllowedIps": json.dumps([CLIENT_IP]),
    }


def _inputs(plan) -> dict[str, dict]:
    return {r.name: r.inputs for r in of_type(plan, JOB) if "trainer_args" in r.inputs}


def test_a_command_job_is_a_job_of_its_own_in_the_plan_with_its_command():
    plan = evaluate(
        "dev", _stack({"mine": MINE, "small": {"trainerConfig": "trainer/presets/demo.yaml"}})
    )
    inputs = _inputs(plan)["platform-dev-job-mine"]
    assert inputs["command"] == ["python", "train.py", "--steps", "40", "--note", "two words"]
    assert (inputs["engine"], inputs["trainer_args"]) == ("torch", [])
    spec = JobSpec.from_props(inputs)
    lines = render(plan, 160).splitlines()
    at = lines.index(
        f"  mine: 1 x Standard_ND96isr_H100_v5, job {spec.job_id}, run folder "
        f"{spec.checkpoint_path}"
    )
    assert lines[at + 1] == (
        "    runs: python train.py --steps 40 --note 'two words' (engine torch, its own command)"
    )
    small = [line for line in lines if line.startswith("  small: ")]
    assert lines[lines.index(small[0]) + 1].startswith("    runs: python -m trainer --")


def test_a_changed_command_replaces_that_job_and_a_running_one_only_when_allowed(monkeypatch):
    before = _inputs(evaluate("dev", _stack({"mine": MINE})))["platform-dev-job-mine"]
    changed = {**MINE, "command": "python train.py --steps 80"}
    after = _inputs(evaluate("dev", _stack({"mine": changed})))["platform-dev-job-mine"]
    provider = TrainingJobProvider()
    diff = provider.diff("id", {**before, "state": "completed"}, after)
    assert diff.replaces == ["command"]
    old, new = JobSpec.from_props(before), JobSpec.from_props(after)
    assert old.job_id != new.job_id and old.run_name != new.run_name  # a fresh run folder
    engine = _inputs(evaluate("dev", _stack({"mine": {**MINE, "engine": "horovod"}})))
    diff = provider.diff("id", {**before, "state": "completed"}, engine["platform-dev-job-mine"])
    assert diff.replaces == ["engine"]
    monkeypatch.setattr(TrainingJobProvider, "_running_state", staticmethod(lambda i, o: "active"))
    with pytest.raises(JobError, match="replaceJobs"):
        provider.diff("id", before, {**after, "protect_running": True})


def test_a_jobs_without_a_command_keep_their_ids_and_run_folders():
    """A trainer job's fields at the new defaults hash as they did before they existed."""
    older = {k: v for k, v in SPEC.__dict__.items() if k not in ("command", "engine")}
    assert JobSpec.from_props(older).job_id == SPEC.job_id
    assert JobSpec.from_props(older).run_name == SPEC.run_name


def test_command_and_trainer_config_together_stop_dt_plan_in_one_line_exit_2(tmp_path):
    result = dt_plan_of_jobs(
        tmp_path, "      command: python train.py\n      trainerConfig: trainer/presets/demo.yaml\n"
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "error: jobs.mine: command and trainerConfig are both set: a job runs either the "
        "trainer or your command; remove jobs.mine.trainerConfig or jobs.mine.command"
    )
    assert result.stdout == ""


# python on a CPU node: a worker records the variables its script got, then exits with
# $SCRIPT_EXIT; anything else (the launcher) runs on the real interpreter.
SCRIPT_STUB = """#!/bin/bash
if [ "$1" = train.py ]; then
    echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK" \\
        "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT" \\
        "HOROVOD_RANK=${HOROVOD_RANK:-none} HOROVOD_SIZE=${HOROVOD_SIZE:-none}" \\
        "DT_RUN_DIR=$DT_RUN_DIR args=$*" >> "$WORKERS_RAN"
    exit "${SCRIPT_EXIT:-0}"
fi
exec %s "$@"
"""


def _run_on_a_cpu_node(tmp_path, engine: str, exit_code: int = 0):
    from tests.trainer.launch.launch_nodes import free_port, held_port

    spec = JobSpec(
        **{
            **SPEC.__dict__,
            "vm_size": "Standard_D2ds_v5",
            "node_count": 1,
            "trainer_args": (),
            "command": ("python", "train.py", "--note", "two words"),
            "engine": engine,
        }
    )
    task = task_options(spec)
    rendezvous = free_port(consecutive=2)
    with held_port() as batch_port:
        env, workdir, ran = one_node_pool(
            tmp_path, SCRIPT_STUB, spec.job_id, batch_port, rendezvous
        )
        env["SCRIPT_EXIT"] = str(exit_code)
        coordination = run_in_container(
            task.multi_instance_settings.coordination_command_line, env, workdir
        )
        assert coordination.returncode == 0, coordination.stdout + coordination.stderr
        report = run_in_container(task.command_line, env, workdir)
    run_dir = f"{tmp_path}/fsmounts/shared/runs/{spec.stack}/{spec.run_name}"
    assert trainer_command(spec) == list(spec.command)  # the command runs as given
    return report, ran.read_text().splitlines(), run_dir, rendezvous


def test_a_torch_command_job_gets_torchruns_variables_and_its_run_folder(tmp_path):
    report, (worker,), run_dir, port = _run_on_a_cpu_node(tmp_path, "torch")
    assert report.returncode == 0, report.stdout + report.stderr
    assert worker == (
        f"RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 "
        f"MASTER_PORT={port + 1} HOROVOD_RANK=none HOROVOD_SIZE=none DT_RUN_DIR={run_dir} "
        "args=train.py --note two words"
    )
    assert f", torch on 127.0.0.1:{port + 1}" in report.stdout
    assert "every node finished" in report.stdout.splitlines()[-1]


def test_a_horovod_command_job_gets_horovodruns_variables(tmp_path):
    report, (worker,), run_dir, _ = _run_on_a_cpu_node(tmp_path, "horovod")
    assert report.returncode == 0, report.stdout + report.stderr
    assert "HOROVOD_RANK=0 HOROVOD_SIZE=1" in worker and f"DT_RUN_DIR={run_dir} " in worker


def test_a_command_that_fails_fails_the_task_with_its_exit_code(tmp_path):
    report, _, _, _ = _run_on_a_cpu_node(tmp_path, "torch", exit_code=3)
    assert report.returncode == 3, report.stdout + report.stderr
    assert "worker 0 exited with 3" in report.stdout
