"""A job's wall-clock limit (jobs.<name>.maxWallClockHours, Batch's constraints.maxWallClockTime):
a week by default, in every job's payload; shown by dt-plan and dt-jobs status; not part of the
job's identity, so an upgrade (state without a limit) sets it on the running job in place
through Job - Update instead of replacing it; a job the limit stopped says so."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import pytest

from dt_commands.jobs.status import status
from dt_commands.plan import evaluate, render
from infra.batch import TASK_ID, job_options
from infra.job import TrainingJobProvider
from infra.settings.checks import ConfigError
from infra.settings.jobs import job_settings
from tests.infra.test_job_payloads import SPEC, StaticToken, _spec, batch  # noqa: F401
from tests.infra.test_job_upgrade import STATES, todays_inputs
from tests.support.stacks import stack_values

WEEK = 168


def _jobs(entry: dict) -> tuple:
    return job_settings({"jobs": {"mine": entry}, "node_count": 2}, {"jobs"})


def test_every_job_gets_a_week_unless_it_sets_its_own():
    (job,) = _jobs({"command": "python -m trainer --help"})
    assert job.max_wall_clock_hours == WEEK
    (own,) = _jobs({"command": "python -m trainer --help", "maxWallClockHours": 12})
    assert own.max_wall_clock_hours == 12
    (unlimited,) = _jobs({"command": "python -m trainer --help", "maxWallClockHours": 0})
    assert unlimited.max_wall_clock_hours == 0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "jobs.mine.maxWallClockHours=-1: must be in 0..8760"),
        (9000, "jobs.mine.maxWallClockHours=9000: must be in 0..8760"),
        ("a day", "jobs.mine.maxWallClockHours"),
    ],
)
def test_a_bad_limit_is_one_line_naming_the_setting(value, message):
    with pytest.raises(ConfigError) as refused:
        _jobs({"command": "python -m trainer --help", "maxWallClockHours": value})
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_the_limit_is_in_the_payload_and_not_in_the_jobs_identity():
    limited = _spec(max_wall_clock_hours=WEEK)
    assert dict(job_options(limited))["constraints"] == {"maxWallClockTime": "P7D"}
    assert "constraints" not in dict(job_options(_spec(max_wall_clock_hours=0)))
    assert (limited.job_id, limited.run_name) == (SPEC.job_id, SPEC.run_name)


def test_dt_plan_shows_each_jobs_limit():
    values = {**stack_values("dev"), "gpu-cluster:jobs": json.dumps({"a": {"command": "x"}})}
    lines = render(evaluate("dev", values), 160).splitlines()
    assert "    limit: Batch stops the job 168 h after its creation (maxWallClockHours)" in lines


@pytest.mark.parametrize("state_file", STATES, ids=[p.stem for p in STATES])
def test_an_upgrade_sets_the_limit_on_each_earlier_job_in_place(state_file):
    state = json.loads(state_file.read_text())
    olds = {**state["inputs"], **state["outputs"]}
    news = {**todays_inputs(state["inputs"]), "max_wall_clock_hours": float(WEEK)}
    diff = TrainingJobProvider().diff(state["outputs"]["job_id"], olds, news)
    assert diff.changes is True and not diff.replaces  # an update: the job stays


def test_removing_a_limit_replaces_the_job():
    state = json.loads(STATES[-1].read_text())
    limited = {**todays_inputs(state["inputs"]), "max_wall_clock_hours": float(WEEK)}
    olds = {**limited, **state["outputs"], "state": "completed"}
    news = {**limited, "max_wall_clock_hours": 0.0, "protect_running": False}
    diff = TrainingJobProvider().diff(state["outputs"]["job_id"], olds, news)
    assert diff.replaces == ["max_wall_clock_hours"]


def _patches(fake, job_id):
    return [r.body for r in fake.requests if r.method == "PATCH" and r.path == f"/jobs/{job_id}"]


@pytest.mark.parametrize(("state", "patched"), [("active", True), ("completed", False)])
def test_the_update_sets_the_limit_on_a_job_that_still_runs(batch, state, patched):  # noqa: F811
    spec = _spec(endpoint=batch.url)
    batch.add_job(spec.job_id, state)
    olds = {**spec.__dict__, "trainer_args": list(spec.trainer_args), "job_id": spec.job_id}
    news = {**olds, "max_wall_clock_hours": float(WEEK), "job_id": None}
    updated = TrainingJobProvider().update(spec.job_id, olds, news)
    expected = [{"constraints": {"maxWallClockTime": "P7D"}}] if patched else []
    assert _patches(batch, spec.job_id) == expected
    assert updated.outs["job_id"] == spec.job_id and updated.outs["state"] == state
    if patched:
        assert batch.jobs[spec.job_id]["constraints"] == {"maxWallClockTime": "P7D"}


def test_status_shows_the_limit_and_a_job_it_stopped(batch):  # noqa: F811
    from azure.batch import BatchClient

    spec = _spec(endpoint=batch.url)
    batch.add_job(spec.job_id, "completed")
    batch.jobs[spec.job_id]["constraints"] = {"maxWallClockTime": "P7D"}
    batch.jobs[spec.job_id]["executionInfo"] = {
        "startTime": "2026-11-20T10:00:00Z",
        "endTime": "2026-11-27T10:00:00Z",
        "terminateReason": "MaxWallClockTimeExpiry",
    }
    batch.tasks[spec.job_id] = [{"id": TASK_ID, "commandLine": "true"}]
    batch.task_state = "completed"
    client = BatchClient(batch.url, StaticToken(), connection_verify=str(batch.ca_path))
    out = io.StringIO()
    status(client, {"job_id": spec.job_id}, out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(
        f"job         {spec.job_id}: completed (stopped by its wall-clock limit, "
        "MaxWallClockTimeExpiry: its checkpoints stay;"
    )
    assert "limit       Batch stops the job 168 h after its creation (maxWallClockHours)" in lines


def test_a_running_job_that_keeps_its_image_still_gets_its_new_limit(batch, monkeypatch):  # noqa: F811
    """An upgrade usually brings a new image too: the protected running job keeps its image
    and gets the limit in place; its state keeps the image it runs."""
    spec = _spec(endpoint=batch.url)
    batch.add_job(spec.job_id, "active")
    olds = {**spec.__dict__, "trainer_args": list(spec.trainer_args), "job_id": spec.job_id}
    news = {
        **olds,
        "image_ref": "acr.azurecr.io/trainer:new@sha256:" + "c" * 64,
        "max_wall_clock_hours": float(WEEK),
        "protect_running": True,
    }
    provider = TrainingJobProvider()
    diff = provider.diff(spec.job_id, olds, news)
    assert diff.changes is True and not diff.replaces
    updated = provider.update(spec.job_id, olds, news)
    assert updated.outs["image_ref"] == spec.image_ref
    assert _patches(batch, spec.job_id) == [{"constraints": {"maxWallClockTime": "P7D"}}]


def test_a_job_older_than_its_new_limit_keeps_its_own(batch, monkeypatch):  # noqa: F811
    """Batch counts the limit from the job's creation: set on a job that ran longer, it would
    stop the job at once. Such a job keeps its own; the warning says why."""
    from infra import job as job_module
    from infra import job_outputs as outputs_module

    told: list[str] = []
    monkeypatch.setattr(
        job_module.pulumi.log, "warn", lambda message, *a, **k: told.append(message)
    )
    spec = _spec(endpoint=batch.url)
    batch.add_job(spec.job_id, "active")
    batch.jobs[spec.job_id]["creationTime"] = "2026-11-01T00:00:00Z"
    monkeypatch.setattr(outputs_module, "utc_now", lambda: datetime(2026, 11, 10, tzinfo=UTC))
    olds = {**spec.__dict__, "trainer_args": list(spec.trainer_args), "job_id": spec.job_id}
    news = {**olds, "max_wall_clock_hours": float(WEEK)}
    updated = TrainingJobProvider().update(spec.job_id, olds, news)
    assert _patches(batch, spec.job_id) == [] and updated.outs["state"] == "active"
    (warning,) = told
    assert f"job {spec.job_id} has run 216 h, past its new wall-clock limit of 168 h" in warning


def test_the_update_of_a_job_deleted_outside_pulumi_keeps_its_state(batch):  # noqa: F811
    spec = _spec(endpoint=batch.url)
    olds = {**spec.__dict__, "trainer_args": list(spec.trainer_args), "job_id": spec.job_id}
    olds["state"] = "active"
    news = {**olds, "max_wall_clock_hours": float(WEEK)}
    updated = TrainingJobProvider().update(spec.job_id, olds, news)
    assert updated.outs["state"] == "active" and _patches(batch, spec.job_id) == []
