"""What the nodes get, pinned byte for byte: the pool's start task for every size, the NFS
server's cloud-init document and readiness gate, compared with the renderings kept in
tests/infra/rendered/. The scripts are files the program fills (infra/node_scripts/); a
change to what a node runs shows here as a diff to review. A change to the NFS server's
cloud-init replaces the server VM, and one to the start task reaches the nodes at their next
restart: either must be deliberate. To take one, run this file with DT_WRITE_RENDERED=1 and
commit the renderings with the reason. A job's command lines are pinned in their form only
(how bash gets them): their words are the job's settings, checked elsewhere."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from infra.batch import job_options, task_options
from infra.cloud_init import ready_command, render_nfs_cloud_init, render_ready_gate
from infra.job_spec import JobSpec
from infra.node_checks import node_check_command
from infra.sizes import CPU_ACCEPTANCE, SUPPORTED

RENDERED = Path(__file__).parent / "rendered"
BASH_C = "/bin/bash -c "


def _matches(name: str, text: str) -> None:
    path = RENDERED / name
    if os.environ.get("DT_WRITE_RENDERED") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no rendering {path}: run this test with DT_WRITE_RENDERED=1"
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from {path}"


def _script_of(command_line: str) -> str:
    """The script of a ``/bin/bash -c`` command line, checked to be quoted as one word."""
    script = shlex.split(command_line)[2]
    assert command_line == BASH_C + shlex.quote(script)
    return script


SHAPES = sorted({(s.gpus, s.ib_ports, s.nvme_disks) for s in SUPPORTED.values()})
SHAPES += sorted({(s.gpus, s.ib_ports, s.nvme_disks) for s in CPU_ACCEPTANCE.values()})


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "{}gpus-{}ib-{}nvme".format(*s))
def test_the_start_task_is_the_pinned_one(shape):
    gpus, ib_ports, nvme_disks = shape
    script = _script_of(node_check_command(gpus, ib_ports, nvme_disks))
    _matches(f"start-task-{gpus}gpus-{ib_ports}ib-{nvme_disks}nvme.txt", script)


@pytest.mark.parametrize("disks", [1, 3])
def test_the_nfs_cloud_init_is_the_pinned_one(disks):
    _matches(f"nfs-cloud-init-{disks}disks.txt", render_nfs_cloud_init(disks, "10.20.0.0/20"))


def test_the_nfs_readiness_gate_is_the_pinned_one():
    assert _script_of(ready_command()) == render_ready_gate()
    _matches("nfs-ready-gate.txt", render_ready_gate())
    custom = render_ready_gate(cloud_init_wait_s=7, marker_attempts=2, marker_poll_s=3)
    assert _script_of(ready_command(custom)) == custom


def _job(plan, **changes) -> JobSpec:
    jobs = [r for r in plan.resources if r.typ == "pulumi-python:dynamic:Resource"]
    spec = JobSpec.from_props(next(r.inputs for r in jobs if "trainer_args" in r.inputs))
    return JobSpec(**{**spec.__dict__, **changes})


@pytest.mark.parametrize("steps", ["code", "data", "code-and-data"])
def test_a_jobs_command_lines_hand_bash_one_word_and_exec_the_last_program(dev_plan, steps):
    # Their words are the job's settings (tests/infra/test_job_payloads.py and others check
    # them); pinned here is how they are handed to bash.
    code = "a" * 64 if "code" in steps else ""
    data = "imagenet/v1" if "data" in steps else ""
    spec = _job(dev_plan, code_sha256=code, dataset_prefix=data)
    task = task_options(spec)
    for line in (task.command_line, task.multi_instance_settings.coordination_command_line):
        assert _script_of(line).startswith("exec python -m trainer.launch ")
    preparation = _script_of(job_options(spec).job_preparation_task.command_line)
    programs = ["trainer.launch.code_folder"] * bool(code) + ["trainer.data"] * bool(data)
    *first, last = preparation.split(" && ")
    assert [step.split()[:3] for step in first] == [["python", "-m", p] for p in programs[:-1]]
    assert last.split()[:4] == ["exec", "python", "-m", programs[-1]]
