"""The pull request's summary of replaced jobs, from a ``pulumi preview --json`` digest.

No Pulumi CLI runs here, so the digest is assembled the way the engine assembles it (the
PreviewDigest/PreviewStep JSON of the CLI's ``display`` package: a replacement with
delete-before-replace is the three steps delete-replaced, replace, create-replacement of one
URN, the replace step carrying ``replaceReasons``; unchanged resources are left out) from what
the engine gets from us: the program's job inputs under Pulumi's mocks, before and after a
change, and our provider's own diff of them.
"""

from __future__ import annotations

import json
import shlex

import pytest

from dt_commands import preview_jobs
from dt_commands.plan import evaluate
from infra.job import TrainingJobProvider
from infra.job_spec import JobSpec
from tests.support.stacks import of_type, stack_values

JOB = "pulumi-python:dynamic:Resource"
URN = "urn:pulumi:dev::gpu-cluster::pulumi-python:dynamic:Resource::"
TWO_JOBS = {
    "resnet": {"trainerConfig": "trainer/presets/resnet50-cluster.yaml"},
    "small": {"trainerConfig": "trainer/presets/demo.yaml", "nodes": 1},
}


def _jobs(jobs: dict, **more) -> dict[str, dict]:
    values = {**stack_values("dev"), "gpu-cluster:jobs": json.dumps(jobs), **more}
    plan = evaluate("dev", values)
    return {r.name: r.inputs for r in of_type(plan, JOB) if "trainer_args" in r.inputs}


SMALL_ON_TWO_NODES = {**TWO_JOBS, "small": {**TWO_JOBS["small"], "nodes": 2}}


@pytest.fixture(scope="module")
def two_jobs() -> dict[str, dict]:
    """The job inputs of the dev stack with ``TWO_JOBS``, under mocks once for this module: the
    deployed side ("before") of every digest here. Read by the replaced, fresh-run,
    added/removed, CLI and kept-running tests; none changes the inputs (each builds new dicts)."""
    return _jobs(TWO_JOBS)


@pytest.fixture(scope="module")
def small_on_two_nodes() -> dict[str, dict]:
    """The job inputs after ``small`` goes to two nodes (``SMALL_ON_TWO_NODES``), under mocks
    once for this module; read by the replaced-job test and the CLI test."""
    return _jobs(SMALL_ON_TWO_NODES)


def _state(inputs: dict, *, deployed: bool) -> dict:
    outputs = dict(inputs)
    if deployed:  # what create() returned for these inputs
        outputs["checkpoint_path"] = JobSpec.from_props(inputs).checkpoint_path
    return {"urn": "", "custom": True, "type": JOB, "inputs": inputs, "outputs": outputs}


def _digest(before: dict[str, dict], after: dict[str, dict]) -> dict:
    """The steps the engine shows for the jobs, with the provider's diff deciding replaces."""
    provider, steps = TrainingJobProvider(), []
    for name in sorted(before.keys() | after.keys()):
        urn = URN + name
        if name not in before:
            steps.append(
                {"op": "create", "urn": urn, "newState": _state(after[name], deployed=False)}
            )
            continue
        old = _state(before[name], deployed=True)
        if name not in after:
            steps.append({"op": "delete", "urn": urn, "oldState": old})
            continue
        diff = provider.diff("id", {**old["outputs"], "state": "completed"}, after[name])
        if diff.changes:
            new = _state(after[name], deployed=False)
            steps += [
                {"op": "delete-replaced", "urn": urn, "oldState": old},
                {
                    "op": "replace",
                    "urn": urn,
                    "oldState": old,
                    "newState": new,
                    "replaceReasons": diff.replaces,
                    "detailedDiff": {},
                },
                {"op": "create-replacement", "urn": urn, "oldState": old, "newState": new},
            ]
    return {"steps": steps, "changeSummary": {}}


def test_one_changed_job_of_two_is_the_one_replace_and_it_resumes(two_jobs, small_on_two_nodes):
    before, after = two_jobs, small_on_two_nodes
    changes = preview_jobs.job_changes(_digest(before, after))
    assert [(c.name, c.change, c.reasons) for c in changes] == [
        ("small", "replaced", ("node count changed",))
    ]
    folder = JobSpec.from_props(after["platform-dev-job-small"]).checkpoint_path
    assert changes[0].training == f"resumes from the newest checkpoint in {folder}"
    text = preview_jobs.render("dev", changes)
    assert "| small | replaced | node count changed | resumes" in text
    args = after["platform-dev-job-small"]["trainer_args"]
    assert changes[0].runs == shlex.join(["python", "-m", "trainer", *args])
    assert text.splitlines()[4].endswith(f" | `{changes[0].runs}` |")
    assert "1 running job(s) would be terminated" in text


def test_a_command_with_a_pipe_stays_in_its_table_cell():
    change = preview_jobs.JobChange("mine", "created", (), "trains", "python x.py 'a|b'")
    row = preview_jobs.render("dev", [change]).splitlines()[4]
    assert row.endswith("| `python x.py 'a\\|b'` |") and row.count(" | ") == 4


def test_new_trainer_settings_say_the_job_starts_a_fresh_run(two_jobs):
    before = two_jobs
    after = _jobs({**TWO_JOBS, "resnet": {"trainerConfig": "trainer/presets/demo.yaml"}})
    (change,) = preview_jobs.job_changes(_digest(before, after))
    old = JobSpec.from_props(before["platform-dev-job-resnet"]).checkpoint_path
    new = JobSpec.from_props(after["platform-dev-job-resnet"]).checkpoint_path
    assert (change.name, change.reasons) == ("resnet", ("trainer settings changed",))
    assert change.training == (
        f"starts a fresh run in {new} (the old run's checkpoints stay in {old})"
    )


def test_added_and_removed_jobs_are_listed_and_no_change_says_so(two_jobs):
    before = two_jobs
    after = _jobs({"resnet": TWO_JOBS["resnet"], "extra": TWO_JOBS["small"]})
    changes = preview_jobs.job_changes(_digest(before, after))
    assert sorted((c.name, c.change) for c in changes) == [
        ("extra", "created"),
        ("small", "deleted"),
    ]
    assert preview_jobs.job_changes(_digest(before, before)) == []
    assert "No training job is created, replaced or deleted." in preview_jobs.render("dev", [])


def test_the_cli_prints_markdown_and_bad_files_are_one_line_errors(
    two_jobs, small_on_two_nodes, tmp_path, capsys
):
    before, after = two_jobs, small_on_two_nodes
    path = tmp_path / "preview.json"
    path.write_text(json.dumps(_digest(before, after)))
    assert preview_jobs.main(["--stack", "dev", str(path)]) == 0
    assert capsys.readouterr().out.startswith("### Training jobs: stack `dev`\n")
    for content, code, message in (
        (b"\xff\xfe garbage", 2, "not JSON"),
        (b"[1, 2]", 2, "not a `pulumi preview --json` digest"),
        (b'{"steps": [{"op": "create"}]}', 2, "a step without a urn"),
    ):
        path.write_bytes(content)
        with pytest.raises(SystemExit) as exited:
            preview_jobs.main(["--stack", "dev", str(path)])
        err = capsys.readouterr().err
        assert exited.value.code == code and message in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exited:
        preview_jobs.main(["--stack", "dev", str(tmp_path / "missing.json")])
    assert exited.value.code == 1 and "cannot read it" in capsys.readouterr().err


def test_a_running_job_that_keeps_its_image_is_listed_as_kept(two_jobs, monkeypatch):
    from infra import batch as batch_module
    from infra import job as job_module

    class Batch:  # Batch says the job is running
        def get_job(self, job_id):
            return type("Job", (), {"state": "active"})()

    before = two_jobs["platform-dev-job-resnet"]
    after = {**before, "image_ref": before["image_ref"] + "-rebuilt", "protect_running": True}
    monkeypatch.setattr(batch_module, "client", lambda endpoint: Batch())
    warned: list[str] = []
    monkeypatch.setattr(
        job_module.pulumi.log, "warn", lambda message, *a, **k: warned.append(message)
    )
    olds = {**_state(before, deployed=True)["outputs"], "state": "active"}
    assert TrainingJobProvider().diff("dev-resnet-0123456789", olds, after).changes is False
    # The engine shows no step for an unchanged resource, and the provider's warning among the
    # digest's diagnostics.
    (message,) = warned
    digest = {
        "steps": [],
        "diagnostics": [{"urn": URN + "resnet", "message": message + "\n", "severity": "warning"}],
    }
    (kept,) = preview_jobs.job_changes(digest)
    assert (kept.name, kept.change) == ("resnet", "kept running")
    rendered = preview_jobs.render("dev", [kept])
    assert "| resnet | kept running | new trainer image waits until the job ends" in rendered


def test_a_failed_preview_still_gets_its_comment_with_the_errors(tmp_path, capsys):
    refusal = "job small (dev-small-1) is active, and this change would replace it (node_count)"
    digest = {
        "diagnostics": [{"urn": URN + "small", "message": refusal + "\n", "severity": "error"}]
    }
    path = tmp_path / "preview.json"
    path.write_text(json.dumps(digest))
    assert preview_jobs.main(["--stack", "dev", str(path)]) == 0
    out = capsys.readouterr().out
    assert "**The preview failed**" in out and f"- {refusal}\n" in out


AML_JOB = "azure-native:machinelearningservices:Job"
AML_URN = "urn:pulumi:dev::gpu-cluster::gpucluster:infra:AzuremlJob$" + AML_JOB + "::"


def _aml_jobs(jobs: dict) -> dict[str, dict]:
    values = {**stack_values("dev"), "gpu-cluster:backend": "azureml"}
    values["gpu-cluster:jobs"] = json.dumps(jobs)
    return {r.name: r.inputs for r in of_type(evaluate("dev", values), AML_JOB)}


def _aml_digest(before: dict[str, dict], after: dict[str, dict]) -> dict:
    """An AzureML job's steps as the engine shows them: its name (``id``, a path parameter) is
    renewed by any change, which azure-native replaces (create before delete)."""
    steps = []
    for name in sorted(before.keys() | after.keys()):
        urn = AML_URN + name
        old = {"type": AML_JOB, "inputs": before[name]} if name in before else None
        new = {"type": AML_JOB, "inputs": after[name]} if name in after else None
        if old is None:
            steps.append({"op": "create", "urn": urn, "newState": new})
        elif new is None:
            steps.append({"op": "delete", "urn": urn, "oldState": old})
        elif old["inputs"]["id"] != new["inputs"]["id"]:
            both = {"urn": urn, "oldState": old, "newState": new}
            steps += [
                {"op": "create-replacement", **both},
                {"op": "replace", **both, "replaceReasons": ["id"]},
                {"op": "delete-replaced", "urn": urn, "oldState": old},
            ]
    return {"steps": steps, "changeSummary": {}}


def test_azureml_jobs_are_summarised_with_why_they_are_replaced_and_where_they_resume():
    small = {"trainerConfig": "trainer/presets/demo.yaml", "nodes": 1}
    before = _aml_jobs({"small": small, "gone": small})
    after = _aml_jobs({"small": {**small, "nodes": 2}, "new": small})
    changes = preview_jobs.job_changes(_aml_digest(before, after))
    by_name = {c.name: c for c in changes}
    assert set(by_name) == {"small", "gone", "new"}
    replaced = by_name["small"]
    assert replaced.change == "replaced" and replaced.reasons == ("node count changed",)
    props = after["platform-dev-job-small-aml"]["properties"]
    run = f"checkpoints/dev/{props['tags']['run']}/"
    # Two nodes instead of one is the same training settings: the same run, resumed.
    assert (
        replaced.training == f"resumes from the newest checkpoint in Blob {run} (if there is one)"
    )
    assert replaced.runs.startswith("python -m trainer --model resnet18 ")
    assert by_name["new"].change == "created"
    assert by_name["gone"].change == "deleted"
    assert by_name["gone"].training.startswith("its record stays in the workspace")
