"""``dt-jobs sweep --stack``: the jobs it submits to a fake Batch account (the real SDK over TLS,
through the job resource's own provider), the job states it waits through, the metrics it reads
back from Azurite (the Blob API, Entra tokens), and the report it writes."""

from __future__ import annotations

import contextlib
import json
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ResourceExistsError

from dt_commands.jobs import main as dt_jobs
from dt_commands.jobs import sweep
from infra import batch as batch_module
from infra.batch import job_options, task_options
from infra.job_spec import JobSpec
from tests.support.fake_batch import FakeBatch, Request
from tests.support.stacks import of_type
from trainer.watch.noise_scale import advice

STAMP = "20261122-230000"
STEPS = 200
GPUS = 8  # Standard_ND96isr_H100_v5, the dev stack's size


class PlaybackBatch(FakeBatch):
    """The fake Batch account, playing back a script of states for each job: every read of a
    job takes the next state, the last one stays. Tasks end with ``exit_codes`` (0 unless
    given)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.scripts: dict[str, list[str]] = {}
        self.exit_codes: dict[str, int] = {}

    def _route(self, request: Request) -> tuple[int, Any]:
        status, body = super()._route(request)
        parts = [p for p in request.path.split("/") if p]
        if request.method != "GET" or status != 200 or parts[:1] != ["jobs"]:
            return status, body
        job_id = parts[1]
        if len(parts) == 2 and self.scripts.get(job_id):
            script = self.scripts[job_id]
            state = script.pop(0) if len(script) > 1 else script[0]
            self.jobs[job_id]["state"] = body["state"] = state
        if len(parts) == 4:  # the task
            code = self.exit_codes.get(job_id, 0)
            result = "success" if code == 0 else "failure"
            body["executionInfo"].update({"exitCode": code, "result": result})
        return status, body


def _train(step: int, rate: float) -> dict[str, Any]:
    return {"kind": "train", "step": step, "epoch": 0, "loss": 2.0, "images_per_sec_total": rate}


@pytest.fixture
def stack_spec(dev_plan) -> JobSpec:
    """The dev stack's job as the program declares it (infra/stack.py -> infra/job.py)."""
    (job,) = [r for r in of_type(dev_plan, sweep.DYNAMIC_TYPE) if "trainer_args" in r.inputs]
    return JobSpec.from_props(job.inputs)


@pytest.fixture
def pool(tmp_path, entra_env, monkeypatch, stack_spec):
    """A fake Batch account and Azurite as the stack's storage, both reached with the same
    DefaultAzureCredential; the stack's state as `pulumi stack export` writes it."""
    fake = PlaybackBatch(tmp_path / "tls")
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(fake.ca_path.read_bytes() + entra_env.ca_file.read_bytes())
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr(sweep, "_stamp", lambda: STAMP)
    # Polls without pausing; a test that needs a clock replaces ``time``.
    monkeypatch.setattr(sweep, "POLL_SECONDS", 0)
    batch_module.client.cache_clear()
    logs = entra_env.container("logs")  # the stack's logs container (JobSpec.log_url)
    with contextlib.suppress(ResourceExistsError):
        logs.create_container()
    spec = replace(stack_spec, endpoint=fake.url, blob_endpoint=entra_env.blob_endpoint + "/")
    inputs = {"__provider": "gASV...", **spec.__dict__, "trainer_args": list(spec.trainer_args)}
    resource = {
        "urn": "urn:pulumi:dev::gpu-cluster::pulumi-python:dynamic:Resource::platform-dev-job",
        "custom": True,
        "type": sweep.DYNAMIC_TYPE,
        "inputs": inputs,
        "outputs": {**inputs, "state": "active"},
    }
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"version": 3, "deployment": {"resources": [resource]}}))
    yield types.SimpleNamespace(fake=fake, spec=spec, state=state, logs=logs)
    fake.close()
    batch_module.client.cache_clear()


def _expected(spec: JobSpec, nodes: int) -> JobSpec:
    """The stack's job with only nodes, steps and name changed."""
    args = (*spec.trainer_args, "--max-steps", str(STEPS))
    settings = (*spec.trainer_settings, ("max_steps", str(STEPS)))
    return replace(
        spec,
        node_count=nodes,
        trainer_args=args,
        trainer_settings=settings,
        name=f"default-sweep-{STAMP}-{nodes}n",
    )


def _sweep(capsys, pool, *options: str) -> tuple[int, str, str]:
    argv = ["sweep", "--stack", "dev", "--state-file", str(pool.state), *options]
    try:
        code = dt_jobs.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_sweep_submits_the_stack_job_with_only_nodes_steps_and_name_changed_and_reports(
    pool, capsys, tmp_path
):
    expected = {nodes: _expected(pool.spec, nodes) for nodes in (1, 2)}
    # Batch: the 2-node job waits for nodes, then both run and complete.
    pool.fake.scripts[expected[1].job_id] = ["active", "active", "completed"]
    pool.fake.scripts[expected[2].job_id] = ["active", "active", "active", "active", "completed"]
    # What each job's rank 0 uploads: a warm-up window, then steady windows.
    rates = {1: [90.0, 2400.0, 2500.0, 2600.0], 2: [150.0, 4400.0, 4500.0, 4460.0]}
    for nodes, spec in expected.items():
        records = [_train(50 * (i + 1), rate) for i, rate in enumerate(rates[nodes])]
        if nodes == 2:
            records.append(
                {"kind": "noise", "step": 200, "noise_scale": 9000.0, "global_batch": 4096}
            )
        data = b"".join(json.dumps(r).encode() + b"\n" for r in records)
        pool.logs.upload_blob(f"{spec.job_id}/live/metrics.jsonl", data, overwrite=True)
    report = tmp_path / "report"

    code, out, err = _sweep(
        capsys, pool, "--nodes", "2,1", "--steps", str(STEPS), "--report", str(report)
    )

    assert (code, err) == (0, "")
    # Each job is created as the job resource creates one: the job, its task, terminatejob.
    posted = {r.body["id"]: r.body for r in pool.fake.requests if r.path == "/jobs"}
    assert list(posted) == [expected[1].job_id, expected[2].job_id]
    for nodes, spec in expected.items():
        assert posted[spec.job_id] == job_options(spec).as_dict()
        (task,) = pool.fake.tasks[spec.job_id]
        assert task == task_options(spec).as_dict()
        assert task["multiInstanceSettings"]["numberOfInstances"] == nodes
        assert pool.fake.jobs[spec.job_id]["onAllTasksComplete"] == "terminatejob"
        assert spec.run_name != pool.spec.run_name  # a fresh run folder, never the stack's
    assert f"{expected[2].job_id}: completed" in out
    assert out.splitlines()[-1] == f"report: {report}/report.md"
    data = json.loads((report / "report.json").read_text())
    # Medians after the warm-up window: 2500 and 4460 images/s; per GPU 2500/8 and 4460/16.
    rows = data["rows"]
    assert [row["images_per_sec"] for row in rows] == [2500.0, 4460.0]
    assert [row["workers"] for row in rows] == [GPUS, 2 * GPUS]
    assert rows[1]["efficiency"] == pytest.approx((4460 / 16) / (2500 / 8))  # 0.892
    # The dev job trains on synthetic ImageNet-sized epochs: 1,281,167 images.
    assert data["epoch_samples"] == 1_281_167
    assert rows[0]["epoch_seconds"] == pytest.approx(1_281_167 / 2500)
    assert rows[1]["cost_per_epoch_usd"] == pytest.approx(98.32 * 2 * 1_281_167 / 4460 / 3600)
    assert data["noise_scale_advice"] == advice(9000.0, 4096)
    assert (report / "scaling.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--nodes", ""], "argument --nodes: '': give counts as positive integers"),
        (["--nodes", "0,2"], "argument --nodes: '0,2': a count must be at least 1"),
        (["--nodes", "one,two"], "argument --nodes: 'one,two': give counts as positive"),
        (["--nodes", "1,4"], "--nodes=1,4: the pool of stack dev has at most 2 nodes"),
        (["--nodes", "1", "--job", "vit"], "job=vit: stack dev has no such job; its jobs: default"),
        (["--nodes", "1", "--model", "tiny"], "unrecognized arguments: --model tiny"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_job_is_submitted(
    pool, capsys, options, message
):
    code, out, err = _sweep(capsys, pool, "--steps", "10", *options)
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert "Traceback" not in err and out == ""
    assert pool.fake.requests == []


def test_an_unknown_stack_is_one_line_and_exit_2(tmp_path, capsys):
    try:
        code = dt_jobs.main(["sweep", "--stack", "nosuch", "--nodes", "1", "--steps", "10"])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        "error: stack=nosuch: stack file Pulumi.nosuch.yaml not found: create it with "
        "`pulumi stack init`\n"
    )


def test_ctrl_c_while_waiting_names_the_submitted_jobs_in_one_line(pool, capsys, monkeypatch):
    def interrupted(_seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(
        sweep, "time", types.SimpleNamespace(monotonic=lambda: 0.0, sleep=interrupted)
    )
    code, _, err = _sweep(capsys, pool, "--nodes", "1,2", "--steps", str(STEPS))
    ids = [_expected(pool.spec, nodes).job_id for nodes in (1, 2)]
    assert code == 130
    assert err == (
        "error: interrupted: no report written; the submitted jobs keep running: "
        f"{', '.join(ids)}\n"
    )
    assert sorted(pool.fake.jobs) == sorted(ids)  # left running, as the line says


def test_a_timeout_and_a_failed_job_exit_1_without_a_report(pool, capsys, tmp_path):
    report = tmp_path / "report"
    ids = {nodes: _expected(pool.spec, nodes).job_id for nodes in (1, 2)}
    code, _, err = _sweep(
        capsys, pool, "--nodes", "1,2", "--steps", str(STEPS), "--report", str(report),
        "--timeout-minutes", "0.0001",
    )  # fmt: skip
    assert code == 1
    assert err.startswith("error: timed out after 0.0001 min; still running: ")
    assert ids[1] in err and ids[2] in err and not report.exists()

    batch_module.client.cache_clear()
    pool.fake.jobs.clear()
    pool.fake.scripts.update({job_id: ["completed"] for job_id in ids.values()})
    pool.fake.exit_codes[ids[2]] = 137
    code, _, err = _sweep(
        capsys, pool, "--nodes", "1,2", "--steps", str(STEPS), "--report", str(report)
    )
    assert code == 1
    log = f"{pool.spec.blob_endpoint}logs/{ids[2]}/stdout.txt"
    assert err == (
        f"error: job(s) failed: {ids[2]} (exit code 137; its log: {log}); no report written\n"
    )
    assert not report.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--steps", "5"], "--workers: required with --local, e.g. --workers 1,2"),
        (["--workers", "1,0", "--steps", "5"], "argument --workers: '1,0': a count must be"),
        (["--workers", "1", "--steps", "0"], "argument --steps: '0': give an integer in 1.."),
        (["--workers", "1", "--nodes", "2", "--steps", "5"], "--local runs on this machine"),
        (["--workers", "1", "--steps", "5", "--output-dir", "x"], "--output-dir: the sweep sets"),
        (["--workers", "1", "--steps", "5", "--max-steps=9"], "--max-steps: the sweep sets it"),
        (["--workers", "1", "--steps", "5", "--backend", "local"], "backend=local: the sweep"),
        (["--workers", "1", "--steps", "5", "--batch-size", "0"], "trainer flags: batch_size=0"),
        (
            ["--workers", "1", "--steps", "5", "--model", "gpt-tiny", "--data", "tokens"],
            "--epoch-samples: needed with data=tokens: give the tokens in one epoch",
        ),
    ],
)
def test_bad_local_input_is_one_line_and_exit_2_before_anything_runs(
    capsys, tmp_path, options, message
):
    if "tokens" in options:  # a dataset whose size the sweep cannot know
        options = [*options, "--data-dir", str(tmp_path)]
    try:
        code = dt_jobs.main(["sweep", "--local", "--report", str(tmp_path / "report"), *options])
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err and captured.err.count("\n") == 1
    assert captured.out == "" and not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("{not json", "not JSON; give the output of `pulumi stack export`"),
        ("[]", "not the output of `pulumi stack export` (no deployment)"),
        ('{"deployment": {"resources": [1, {"type": "x"}]}}', "the state has no training job"),
    ],
)
def test_a_state_file_without_the_job_is_one_line_and_exit_2(tmp_path, capsys, state, message):
    path = tmp_path / "state.json"
    path.write_text(state)
    argv = ["sweep", "--stack", "dev", "--state-file", str(path), "--nodes", "1", "--steps", "9"]
    try:
        code = dt_jobs.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_a_job_deployed_before_its_settings_were_data_is_one_line_naming_the_fix(pool, capsys):
    """State an earlier version wrote has the job's flags only: the sweep does not read them
    back; one `pulumi up` records the settings (and replaces no job: test_job_upgrade)."""
    state = json.loads(pool.state.read_text())
    (resource,) = state["deployment"]["resources"]
    del resource["inputs"]["trainer_settings"]
    pool.state.write_text(json.dumps(state))
    code, out, err = _sweep(capsys, pool, "--nodes", "1", "--steps", str(STEPS))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "no trainer settings this version can read; run `pulumi up` with this version" in err
    assert pool.fake.calls() == []  # nothing submitted


def _stub_pulumi(folder: Path, script: str) -> str:
    """A ``pulumi`` on PATH that runs ``script`` in bash (its arguments are "$@")."""
    folder.mkdir()
    stub = folder / "pulumi"
    stub.write_text(f"#!/bin/bash\n{script}\n")
    stub.chmod(0o755)
    return f"{folder}:/usr/bin:/bin"


def test_the_stack_state_comes_from_pulumi_stack_export(tmp_path, monkeypatch):
    """Through a real process, as the sweep runs the CLI: the arguments it passes, the state it
    reads from the output, and a failure or a missing CLI as one line naming the way round."""
    state = {"deployment": {"resources": []}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    script = f'echo "$@" > {tmp_path}/argv; cat {tmp_path}/state.json'
    monkeypatch.setenv("PATH", _stub_pulumi(tmp_path / "ok", script))
    assert sweep.read_state("dev", None) == state
    assert (tmp_path / "argv").read_text().split() == ["stack", "export", "--stack", "dev"]

    failing = 'echo "noise" >&2; echo "error: no stack named \'dev\' found" >&2; exit 255'
    monkeypatch.setenv("PATH", _stub_pulumi(tmp_path / "failing", failing))
    with pytest.raises(sweep.SweepError) as failed:
        sweep.read_state("dev", None)
    assert str(failed.value) == (
        "stack=dev: `pulumi stack export` failed (error: no stack named 'dev' found)"
    )
    assert failed.value.code == 2

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(sweep.SweepError) as missing:
        sweep.read_state("dev", None)
    assert str(missing.value) == (
        "the pulumi CLI is not on PATH: install it, or pass --state-file with the output of "
        "`pulumi stack export`"
    )
