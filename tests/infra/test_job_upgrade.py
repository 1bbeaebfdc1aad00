"""Upgrading the program replaces no job: the state each earlier released shape of the job
provider wrote (tests/infra/job_states/<commit>.json: its inputs and outputs as the engine
keeps them, numbers as floats and sequences as lists) diffs as no change against the same job's
settings sent with today's fields (every field JobSpec has, lists and floats as the engine
sends them, the wall-clock limit as those jobs had it: none; the default limit an upgrade
brings is set in place, tests/infra/test_job_wall_clock.py; and the job's settings as data,
which no earlier shape had), and a real change still replaces it."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from infra.job import TrainingJobProvider
from infra.job_spec import JobSpec
from infra.trainer_command import trainer_flags

STATES = sorted((Path(__file__).parent / "job_states").glob("*.json"))
# The trainer settings every recorded job was made from (its trainer_args render them), as
# today's program sends them beside the flags (infra.trainer_command.JobTrainer).
RECORDED_SETTINGS = [["model", "resnet50"], ["epochs", "90"], ["batch_size", "256"]]


def _as_the_engine_sends(value: Any) -> Any:
    """Protobuf Struct values: every number a float, every sequence a list."""
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value)
    return [_as_the_engine_sends(item) for item in value]


def todays_inputs(old_inputs: dict[str, Any]) -> dict[str, Any]:
    """What today's program sends for the job those inputs describe: every field JobSpec has,
    at its default where the stack sets nothing new."""
    spec = JobSpec.from_props(old_inputs)
    values = {f.name: _as_the_engine_sends(getattr(spec, f.name)) for f in fields(JobSpec)}
    return {**values, "trainer_settings": RECORDED_SETTINGS, "protect_running": True}


@pytest.mark.parametrize("state_file", STATES, ids=[p.stem for p in STATES])
def test_an_earlier_providers_state_diffs_as_no_change(state_file):
    state = json.loads(state_file.read_text())
    olds = {**state["inputs"], **state["outputs"]}
    news = todays_inputs(state["inputs"])
    assert trainer_flags(JobSpec.from_props(news).trainer_settings) == tuple(news["trainer_args"])
    diff = TrainingJobProvider().diff(state["outputs"]["job_id"], olds, news)
    assert diff.changes is False, f"{state['what']}: replaces {diff.replaces}"


@pytest.mark.parametrize("state_file", STATES, ids=[p.stem for p in STATES])
def test_a_real_change_to_an_earlier_job_still_replaces_it(state_file, monkeypatch):
    state = json.loads(state_file.read_text())
    olds = {**state["inputs"], **state["outputs"], "state": "completed"}
    news = {**todays_inputs(state["inputs"]), "trainer_args": ["--model", "resnet18"]}
    news["protect_running"] = False
    diff = TrainingJobProvider().diff(state["outputs"]["job_id"], olds, news)
    assert diff.changes is True and diff.replaces == ["trainer_args"]
