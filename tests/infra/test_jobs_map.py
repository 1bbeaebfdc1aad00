"""Several named jobs per stack: the `jobs` map under Pulumi's mocks, what a change to one job
does to the others as the job provider's diff decides it, and protectRunningJobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dt_commands.plan import Plan, evaluate
from infra import batch as batch_module
from infra.batch_calls import JobError
from infra.job import TrainingJobProvider
from infra.job_spec import JobSpec
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from infra.settings.values import load_schema
from tests.support.stacks import of_type, one, stack_values

JOB = "pulumi-python:dynamic:Resource"
DEMO = "trainer/presets/demo.yaml"
TWO_JOBS = {
    "resnet": {"trainerConfig": "trainer/presets/resnet50-cluster.yaml"},
    "small": {"trainerConfig": "trainer/presets/demo.yaml", "nodes": 1, "priority": 100},
}


def _stack(jobs: dict | None = None, **more) -> dict:
    values = {k: v for k, v in stack_values("dev").items()}
    if jobs is not None:
        values["gpu-cluster:jobs"] = json.dumps(jobs)
    return {**values, **more}


def _jobs(plan) -> dict[str, dict]:
    return {r.name: r.inputs for r in of_type(plan, JOB) if "trainer_args" in r.inputs}


@pytest.fixture(scope="module")
def two_jobs_plan() -> Plan:
    """The dev stack with the ``TWO_JOBS`` map, evaluated under mocks once for this module (the
    same program on the same settings each time; the tests only read the plan, and copy a job's
    inputs before changing them). Read by the tests of the map's resources, of a change to one
    job, of protectRunningJobs and of the plan's run folders."""
    return evaluate("dev", _stack(TWO_JOBS))


def test_each_job_of_the_map_is_its_own_resource_with_its_own_id_and_run_folder(two_jobs_plan):
    plan = two_jobs_plan
    jobs = _jobs(plan)
    assert set(jobs) == {"platform-dev-job-resnet", "platform-dev-job-small"}
    resnet, small = jobs["platform-dev-job-resnet"], jobs["platform-dev-job-small"]
    assert (resnet["name"], small["name"]) == ("resnet", "small")
    assert (resnet["node_count"], small["node_count"]) == (plan.settings.cluster.node_count, 1)
    assert small["priority"] == 100
    specs = [JobSpec.from_props(inputs) for inputs in jobs.values()]
    assert len({spec.job_id for spec in specs}) == 2
    assert len({spec.checkpoint_path for spec in specs}) == 2
    assert all(spec.job_id.startswith(f"dev-{spec.name}-") for spec in specs)
    assert set(plan.outputs["jobs"]) == {"resnet", "small"}
    assert plan.outputs["jobs"]["small"]["node_count"] == 1
    assert plan.outputs["jobs"]["small"]["metrics_url"].endswith("/live/")
    assert "job_id" not in plan.outputs  # two jobs: no single-job outputs


def test_the_shorthand_keeps_its_resource_name_job_id_and_run_folder(dev_plan):
    job = one(dev_plan, JOB, "-job")
    spec = JobSpec.from_props(job.inputs)
    assert job.name == "platform-dev-job" and spec.name == ""
    # The hash leaves out the fields at their defaults: the id an older stack's job has.
    older = {k: v for k, v in job.inputs.items() if k not in ("name", "priority")}
    assert JobSpec.from_props(older).job_id == spec.job_id
    assert set(dev_plan.outputs["jobs"]) == {"default"}
    assert dev_plan.outputs["job_id"] == spec.job_id


def test_a_change_to_one_job_replaces_exactly_that_job(two_jobs_plan):
    before = _jobs(two_jobs_plan)
    changed = {**TWO_JOBS, "small": {**TWO_JOBS["small"], "nodes": 2}}
    after = _jobs(evaluate("dev", _stack(changed)))
    provider = TrainingJobProvider()
    diffs = {
        name: provider.diff("id", {**before[name], "state": "completed"}, after[name])
        for name in after
    }
    assert [name for name, diff in diffs.items() if diff.changes] == ["platform-dev-job-small"]
    assert diffs["platform-dev-job-small"].replaces == ["node_count"]
    # Adding a job touches no other.
    added = _jobs(evaluate("dev", _stack({**TWO_JOBS, "extra": TWO_JOBS["small"]})))
    for name in before:
        assert not provider.diff("id", before[name], added[name]).changes


def test_upgrading_a_shorthand_job_state_without_the_new_fields_changes_nothing(dev_plan):
    news = one(dev_plan, JOB, "-job").inputs
    olds = {k: v for k, v in news.items() if k not in ("name", "priority", "protect_running")}
    assert not TrainingJobProvider().diff("id", olds, news).changes


class _Job:
    def __init__(self, state: str) -> None:
        self.state = state


class _Batch:
    def __init__(self, state: str) -> None:
        self._state = state

    def get_job(self, job_id: str) -> _Job:
        return _Job(self._state)


@pytest.mark.parametrize(
    ("live", "protect", "refused"),
    [("active", True, True), ("completed", True, False), ("active", False, False)],
)
def test_a_running_job_is_not_replaced_unless_allowed(
    two_jobs_plan, monkeypatch, live, protect, refused
):
    monkeypatch.setattr(batch_module, "client", lambda endpoint: _Batch(live))
    jobs = _jobs(two_jobs_plan)
    olds = {**jobs["platform-dev-job-small"], "state": "active"}
    news = {**olds, "node_count": 2, "protect_running": protect, "state": None}
    provider = TrainingJobProvider()
    if refused:
        with pytest.raises(JobError) as failure:
            provider.diff("dev-small-0123456789", olds, news)
        message = str(failure.value)
        assert "\n" not in message
        assert message.startswith("job small (dev-small-0123456789) is active")
        assert "(node_count)" in message and "replaceJobs" in message
    else:
        assert provider.diff("dev-small-0123456789", olds, news).replaces == ["node_count"]


def test_replace_jobs_lifts_the_protection_for_the_named_job_only():
    plan = evaluate("dev", _stack(TWO_JOBS, **{"gpu-cluster:replaceJobs": '["small"]'}))
    jobs = _jobs(plan)
    assert jobs["platform-dev-job-small"]["protect_running"] is False
    assert jobs["platform-dev-job-resnet"]["protect_running"] is True


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"jobs": TWO_JOBS, "trainerConfig": "trainer/presets/demo.yaml"}, "both set"),
        ({"jobs": {"Bad_Name": TWO_JOBS["small"]}}, "jobs.Bad_Name: a job name"),
        ({"jobs": {"a": {"trainerConfig": "trainer/presets/demo.yaml", "nodes": 9}}}, "nodes=9"),
        ({"jobs": {"a": {"trainerConfig": "trainer/presets/demo.yaml", "gpus": 1}}}, "a.gpus"),
        ({"jobs": {"a": {"nodes": 1}}}, "jobs.a.trainerConfig: required"),
        ({"jobs": {"a": {"trainerConfig": "nope.yaml"}}}, "jobs.a.trainerConfig=nope.yaml"),
        ({"jobs": {"a": {"trainerConfig": DEMO, "priority": 5000}}}, "-1000"),
        ({"jobs": TWO_JOBS, "replaceJobs": ["missing"]}, "no job named 'missing'"),
        ({"jobs": "resnet"}, "expected object"),
    ],
)  # fmt: skip
def test_bad_job_maps_are_one_line_errors(values, message):
    merged = {**stack_values("dev"), **values}
    with pytest.raises(ConfigError, match=message) as failure:
        StackSettings.from_mapping("dev", merged, load_schema())
    assert "\n" not in str(failure.value)


def test_the_plan_names_each_jobs_run_folder(two_jobs_plan):
    from dt_commands.plan import render

    plan = two_jobs_plan
    text = render(plan, 160)
    for spec in (JobSpec.from_props(inputs) for inputs in _jobs(plan).values()):
        line = (
            f"  {spec.name}: {spec.node_count} x Standard_ND96isr_H100_v5, job {spec.job_id}, "
            f"run folder {spec.checkpoint_path}"
        )
        assert line in text.splitlines()


def _deployed(tmp_path, plan, **jobs_changed) -> Path:
    """The `pulumi stack output --json` of a stack deployed with ``plan``'s jobs."""
    jobs = {
        spec.name: {"job_id": spec.job_id, "job_checkpoint_path": spec.checkpoint_path}
        for spec in (JobSpec.from_props(inputs) for inputs in _jobs(plan).values())
    }
    path = tmp_path / "outputs.json"
    path.write_text(
        json.dumps(
            {"batch_account_endpoint": "b.eastus.batch.azure.com", "jobs": {**jobs, **jobs_changed}}
        )
    )
    return path


def test_the_plan_against_the_deployed_outputs_says_which_jobs_start_a_fresh_run(
    two_jobs_plan, tmp_path, capsys
):
    from dt_commands.plan import main

    deployed = _deployed(
        tmp_path,
        two_jobs_plan,
        gone={"job_id": "dev-gone-1", "job_checkpoint_path": "shared/runs/dev/aaa"},
    )
    changed = {
        "resnet": TWO_JOBS["resnet"],
        "small": {"trainerConfig": DEMO, "nodes": 2},
        "new": TWO_JOBS["small"],
    }
    stack_file = tmp_path / "Pulumi.dev.yaml"
    values = {k: (json.loads(v) if k.endswith(":jobs") else v) for k, v in _stack(changed).items()}
    stack_file.write_text(json.dumps({"config": values}))
    assert (
        main(["--stack", "dev", "--stack-file", str(stack_file), "--deployed", str(deployed)]) == 0
    )
    lines = capsys.readouterr().out.splitlines()

    def line(name):
        return next(entry for entry in lines if entry.startswith(f"  {name}: "))

    assert line("resnet").endswith("; continues the deployed run")
    assert line("small").endswith("; continues the deployed run")  # nodes do not change the run
    assert line("new").endswith("; a new job")
    assert (
        line("gone")
        == "  gone: deleted by this change (its checkpoints stay in shared/runs/dev/aaa)"
    )

    changed["small"] = {"trainerConfig": "trainer/presets/resnet50-cluster.yaml", "nodes": 1}
    values = {k: (json.loads(v) if k.endswith(":jobs") else v) for k, v in _stack(changed).items()}
    stack_file.write_text(json.dumps({"config": values}))
    assert (
        main(["--stack", "dev", "--stack-file", str(stack_file), "--deployed", str(deployed)]) == 0
    )
    small = next(
        entry for entry in capsys.readouterr().out.splitlines() if entry.startswith("  small: ")
    )
    assert "; STARTS A FRESH RUN (the deployed job trains in shared/" in small


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xe9t\xe9", "--deployed=OUT: not UTF-8 text (byte 0xe9 at offset 0)"),
        (b"{", "--deployed=OUT: not JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"jobs": {"a": null}}', "output jobs.a must be an object"),
    ],
)
def test_a_bad_deployed_outputs_file_is_a_one_line_error(tmp_path, capsys, content, message):
    from dt_commands.plan import main

    path = tmp_path / "outputs.json"
    path.write_bytes(content)
    assert main(["--stack", "dev", "--deployed", str(path)]) == 2
    err = capsys.readouterr().err
    assert message.replace("OUT", str(path)) in err and err.count("\n") == 1
