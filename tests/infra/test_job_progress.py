"""A refresh of a job (every `pulumi up` and `pulumi preview --refresh`: Pulumi.yaml sets
refresh: always) shows its current step and images/s, read the way the provider reads them in
production: the real azure-batch client against the fake Batch server, and the real
azure-storage-blob client against Azurite over HTTPS with a bearer token from
DefaultAzureCredential (the managed identity of a fake metadata service standing in for the
deployer's `az login`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from infra import batch as batch_module
from infra import job as job_module
from infra import job_outputs as outputs_module
from infra.batch import TASK_ID
from infra.job import TrainingJobProvider
from tests.infra.test_job_payloads import _spec
from tests.support.fake_batch import FakeBatch
from tests.support.ports import free_port
from trainer.launch.records import KEEP_OUT_HINT


def _train(step, rate):
    return {"kind": "train", "step": step, "epoch": 0, "loss": 2.0, "images_per_sec_total": rate}


@pytest.fixture
def cloud(tmp_path, entra_env, monkeypatch):
    """The fake Batch account and Azurite, both trusted, with one job running on the fake."""
    fake = FakeBatch(tmp_path / "tls")
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_bytes(fake.ca_path.read_bytes() + entra_env.ca_file.read_bytes())
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    batch_module.client.cache_clear()
    logs = entra_env.container("logs")
    if not logs.exists():
        logs.create_container()
    yield fake, entra_env, logs
    fake.close()
    batch_module.client.cache_clear()


def _state(fake: FakeBatch, storage, stack: str) -> tuple[str, dict]:
    """The state a job created by an earlier provider version left: inputs and the outputs of
    then, without metrics_url (derived from log_url)."""
    spec = _spec(stack=stack, endpoint=fake.url, blob_endpoint=storage.blob_endpoint + "/")
    fake.add_job(spec.job_id, "active")
    fake.tasks[spec.job_id] = [{"id": TASK_ID, "commandLine": "true"}]
    props = {**spec.__dict__, "trainer_args": list(spec.trainer_args)}
    return spec.job_id, {**props, "job_id": spec.job_id, "state": "active", "log_url": spec.log_url}


@pytest.fixture
def warnings(monkeypatch) -> list[str]:
    """What the provider tells the engine as warnings."""
    told: list[str] = []
    monkeypatch.setattr(
        job_module.pulumi.log, "warn", lambda message, *a, **k: told.append(message)
    )
    return told


def _upload(logs, job_id: str, records, tail: bytes = b"") -> None:
    data = b"".join(json.dumps(r).encode() + b"\n" for r in records) + tail
    logs.upload_blob(f"{job_id}/live/metrics.jsonl", data, overwrite=True)


def test_a_refresh_shows_the_last_logged_step_and_images_per_second(cloud):
    fake, storage, logs = cloud
    job_id, state = _state(fake, storage, "progress")
    records = [_train(step, 100.0 + step / 3) for step in range(1, 41)]
    # An evaluation after the last training step, and a line the uploader was still writing.
    _upload(logs, job_id, [*records, {"kind": "eval", "step": 40, "loss": 1.0}], b'{"kind": "tr')
    outs = TrainingJobProvider().read(job_id, state).outs
    assert (outs["state"], outs["task_state"], outs["retries"]) == ("active", "running", 0)
    assert outs["step"] == 40 and outs["images_per_sec"] == round(100.0 + 40 / 3, 1)
    assert outs["metrics_url"] == f"{storage.blob_endpoint}/logs/{job_id}/live/"


def test_a_language_models_job_shows_tokens_per_second_not_images(cloud):
    fake, storage, logs = cloud
    job_id, state = _state(fake, storage, "gpt")
    record = {"kind": "train", "step": 12, "epoch": 0, "loss": 3.0, "tokens_per_sec_total": 8192.0}
    _upload(logs, job_id, [record])
    outs = TrainingJobProvider().read(job_id, state).outs
    assert outs["step"] == 12 and outs["tokens_per_sec"] == 8192.0
    assert "images_per_sec" not in outs


def test_before_the_first_upload_a_refresh_shows_no_step_and_no_warning(cloud, warnings):
    fake, storage, _ = cloud
    job_id, state = _state(fake, storage, "early")
    outs = TrainingJobProvider().read(job_id, state).outs
    assert outs["state"] == "active" and "step" not in outs and "images_per_sec" not in outs
    assert warnings == []


def test_storage_it_cannot_reach_warns_once_and_the_refresh_goes_on(cloud, warnings):
    fake, storage, _ = cloud
    job_id, state = _state(fake, storage, "unreachable")
    closed = f"https://127.0.0.1:{free_port()}/devstoreaccount1/logs/{job_id}/live/"
    outs = TrainingJobProvider().read(job_id, {**state, "metrics_url": closed}).outs
    assert outs["state"] == "active" and "step" not in outs
    assert len(warnings) == 1
    assert warnings[0].startswith(f"job {job_id}: no current step: {closed}metrics.jsonl: ")


def _uploaded_at(logs, job_id: str) -> str:
    """When Azurite says the job's metrics.jsonl was last uploaded (its Last-Modified)."""
    properties = logs.get_blob_client(f"{job_id}/live/metrics.jsonl").get_blob_properties()
    return properties.last_modified.astimezone(UTC).isoformat()


def test_a_refresh_says_when_the_step_it_shows_was_uploaded(cloud, warnings):
    fake, storage, logs = cloud
    job_id, state = _state(fake, storage, "dated")
    _upload(logs, job_id, [_train(7, 90.0)])
    outs = TrainingJobProvider().read(job_id, state).outs
    assert outs["step"] == 7 and outs["progress_at"] == _uploaded_at(logs, job_id)
    assert outs["progress_error"] is None and warnings == []


def test_a_failed_progress_read_keeps_the_last_step_marked_with_its_age(
    cloud, warnings, monkeypatch
):
    fake, storage, logs = cloud
    job_id, state = _state(fake, storage, "stale")
    _upload(logs, job_id, [_train(40, 120.0)])
    before = TrainingJobProvider().read(job_id, state).outs
    uploaded = datetime.fromisoformat(before["progress_at"])
    # Three hours later this machine can no longer reach the account.
    monkeypatch.setattr(outputs_module, "utc_now", lambda: uploaded + timedelta(hours=3, minutes=5))
    closed = f"https://127.0.0.1:{free_port()}/devstoreaccount1/logs/{job_id}/live/"
    outs = TrainingJobProvider().read(job_id, {**before, "metrics_url": closed}).outs
    assert (outs["step"], outs["images_per_sec"]) == (40, 120.0)
    assert outs["progress_at"] == before["progress_at"]
    error = outs["progress_error"]
    assert error.startswith(f"{closed}metrics.jsonl: ") and "\n" not in error
    (warning,) = warnings
    assert warning.startswith(f"job {job_id}: no current step: {closed}metrics.jsonl: ")
    assert warning.endswith(
        f"; step 40 and 120.0 images/s are as of {before['progress_at']} (3 h 5 min ago)"
    )
    # The next good read is current again.
    reachable = {**outs, "metrics_url": before["metrics_url"]}
    again = TrainingJobProvider().read(job_id, reachable).outs
    assert again["progress_error"] is None


def test_a_refresh_reports_why_the_pool_gives_the_job_no_nodes(cloud, warnings):
    from tests.dt_commands.jobs.test_ops import QUOTA_MESSAGE, pool_in_trouble

    fake, storage, _ = cloud
    job_id, state = _state(fake, storage, "stuck")
    pool_in_trouble(fake)
    outs = TrainingJobProvider().read(job_id, state).outs
    errors = outs["pool_errors"]
    assert len(errors) == 2 and QUOTA_MESSAGE in errors[0], errors
    assert "--stack stuck --job default" in errors[1]
    assert [w for w in warnings if "pool ib-gpu" in w] == [f"job {job_id}: {e}" for e in errors]
    fake.pools["ib-gpu"].pop("resizeErrors")
    fake.pool_nodes["ib-gpu"] = []
    assert TrainingJobProvider().read(job_id, state).outs["pool_errors"] == []


def test_a_refresh_names_the_nodes_whose_dataset_staging_failed(cloud, warnings):
    """Every node's job preparation (the dataset staging) failed: Batch keeps the task active
    and says so only in the preparation listing; the refresh names the nodes and the fix."""
    fake, storage, _ = cloud
    job_id, state = _state(fake, storage, "staging")
    said = "dt-data stage: datasets/imagenet/manifest.json: no such blob"
    fake.prepare_fails(job_id, ["tvmps_0", "tvmps_1"], said)
    errors = TrainingJobProvider().read(job_id, state).outs["pool_errors"]
    (line,) = errors
    assert line.startswith(f"job {job_id}: the job preparation task (the job's code, then its ")
    assert "2 node(s)" in line and "tvmps_0" in line and "exit code 1" in line
    assert f"tvmps_0's preparation said: {said}" in line
    assert "jobpreparation/stderr.txt" in line and "--stack staging --job default" in line
    assert "\n" not in line
    assert f"job {job_id}: {line}" in warnings


def test_a_code_job_whose_requirements_do_not_install_is_named_with_pips_first_error(
    cloud, warnings
):
    """A code job's preparation fails at its pip install (trainer.launch.code_folder writes pip's
    first ERROR line last on stderr): the refresh names that step and pip's line, not the
    dataset."""
    fake, storage, _ = cloud
    job_id, state = _state(fake, storage, "code")
    said = (
        "requirements.txt of the job's code does not install: ERROR: No matching "
        "distribution found for torchh==2.13.0"
    )
    fake.prepare_fails(job_id, ["tvmps_0"], said)
    (line,) = TrainingJobProvider().read(job_id, state).outs["pool_errors"]
    assert f"(tvmps_0: exit code 1; tvmps_0's preparation said: {said})" in line
    assert "the job's code or its requirements.txt" in line and "\n" not in line


def test_the_preparations_last_line_is_read_past_a_long_stderr(cloud, warnings):
    """pip writes far more than a few KiB to stderr before it fails (a deprecation warning per
    package, resolver back-tracking); the line quoted is the file's last, wherever it lies."""
    fake, storage, _ = cloud
    job_id, state = _state(fake, storage, "long")
    said = "requirements.txt of the job's code does not install: ERROR: ResolutionImpossible"
    fake.prepare_fails(job_id, ["tvmps_0"], said)
    (stderr,) = [p for p in fake.node_files["tvmps_0"] if p.endswith("/stderr.txt")]
    noise = b"".join(
        b"DEPRECATION: package %d uses a legacy setup.py install\n" % i for i in range(400)
    )
    fake.node_files["tvmps_0"][stderr] = bytearray(noise + said.encode() + b"\n")
    (line,) = TrainingJobProvider().read(job_id, state).outs["pool_errors"]
    assert f"tvmps_0's preparation said: {said})" in line, line


def test_a_refresh_names_the_ranks_the_run_found_slower_in_its_latest_window(cloud, warnings):
    """``kind: straggler`` records (trainer.watch.stragglers) reach the job's ``stragglers`` output:
    the latest window's only, one line each naming rank, host and how much slower."""
    fake, storage, logs = cloud
    job_id, state = _state(fake, storage, "slow")

    def straggler(step, rank, excess):
        return {"kind": "straggler", "step": step, "rank": rank, "host": f"node-{rank}",
                "metric": "data_wait_sec", "seconds": 0.2, "others_sec": 0.01,
                "excess_of_step": excess}  # fmt: skip

    records = [_train(40, 100.0), straggler(40, 3, 0.9), _train(50, 90.0)]
    records += [straggler(50, 1, 0.6), straggler(50, 2, 0.55)]
    _upload(logs, job_id, records)
    outs = TrainingJobProvider().read(job_id, state).outs
    assert outs["stragglers"] == [
        "rank 1 on node-1: data_wait_sec 0.200s per step against 0.010s on the other ranks, "
        "60% of a step slower (step 50)",
        "rank 2 on node-2: data_wait_sec 0.200s per step against 0.010s on the other ranks, "
        "55% of a step slower (step 50)",
    ]
    _upload(logs, job_id, [_train(60, 100.0)])
    assert TrainingJobProvider().read(job_id, state).outs["stragglers"] == []


def test_a_refresh_records_how_the_last_failed_try_ended_and_keeps_it_across_the_retry(cloud):
    """The ``last_try`` output: the primary's report line of the last finished try (the node
    whose rank failed it, and how to keep it out), read through the Batch file API; a retry
    that starts replaces the file it was read from, and the line the refresh before read stays."""
    fake, storage, _ = cloud
    job_id, state = _state(fake, storage, "failed-try")
    fake.jobs[job_id]["poolInfo"] = {"poolId": "ib-gpu"}
    assert TrainingJobProvider().read(job_id, state).outs.get("last_try") is None  # no retry yet
    fake.task_retries = 1
    fake.place_task(job_id, TASK_ID, ["tvm-0", "tvm-1"])
    failed = (
        "attempt 20261127T081000Z-1a2b3c failed: node 10.0.0.5 (tvm-1) worker 0 exited with -9 "
        f"(exit 137); {KEEP_OUT_HINT}"
    )
    fake.write(job_id, TASK_ID, 0, f"[launch 10.0.0.4] ...\n===== {failed}\n".encode())
    outs = TrainingJobProvider().read(job_id, state).outs
    assert outs["last_try"] == failed
    fake.node_files["tvm-0"] = {}  # the retry started: a new, empty stdout.txt
    fake.place_task(job_id, TASK_ID, ["tvm-0", "tvm-1"])
    assert TrainingJobProvider().read(job_id, outs).outs["last_try"] == failed
