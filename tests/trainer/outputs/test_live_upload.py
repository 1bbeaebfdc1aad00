"""Rank 0's live upload of metrics.jsonl and TensorBoard files, against Azurite over HTTPS with
the managed identity's bearer tokens (DefaultAzureCredential, as on a node; no keys)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import tiny_config
from tests.support.ports import free_port
from tests.trainer.traces import traces
from trainer.common import blob_client
from trainer.common.blob_folder import BlobFolder
from trainer.outputs.live_upload import LiveUploader
from trainer.settings.flags import to_flags

REPO = Path(__file__).resolve().parents[3]


def _wait(condition, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _blobs(container, prefix=""):
    return {b.name: b for b in container.list_blobs(name_starts_with=prefix)}


def _content(container, name):
    return container.download_blob(name).readall()


def _record(folder: Path) -> None:
    (folder / "tensorboard").mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    (folder / "tensorboard" / "events.out.tfevents.1.node.1").write_bytes(b"\x00event")


def test_every_period_only_changed_files_are_uploaded_again(tmp_path, entra_env, logs):
    _record(tmp_path)
    folder = BlobFolder.parse(entra_env.folder_url(logs.container_name, "job-1/live/"))
    uploader = LiveUploader(tmp_path, folder, period_s=0.2).start()
    try:
        # The counter moves after each upload returns: wait for it, not only for the blobs.
        _wait(lambda: len(_blobs(logs)) == 2 and uploader.uploads == 2, "the first upload")
        first = {name: blob.etag for name, blob in _blobs(logs).items()}
        assert set(first) == {
            "job-1/live/metrics.jsonl",
            "job-1/live/tensorboard/events.out.tfevents.1.node.1",
        }
        time.sleep(0.6)  # periods without changes send nothing
        assert uploader.uploads == 2
        with open(tmp_path / "metrics.jsonl", "a") as file:
            file.write('{"kind": "train", "step": 2}\n')
        _wait(lambda: uploader.uploads == 3, "the changed file's upload")
    finally:
        uploader.close()
    now = _blobs(logs)
    assert now["job-1/live/metrics.jsonl"].etag != first["job-1/live/metrics.jsonl"]
    events = "job-1/live/tensorboard/events.out.tfevents.1.node.1"
    assert now[events].etag == first[events]  # unchanged: not sent again
    assert _content(logs, "job-1/live/metrics.jsonl") == (tmp_path / "metrics.jsonl").read_bytes()
    assert entra_env.imds.tokens_issued >= 1  # the identity's token, not a key


def test_a_failed_period_logs_one_line_and_the_next_one_retries(
    tmp_path, entra_env, azurite_entra, caplog, monkeypatch
):
    monkeypatch.setattr(blob_client, "RETRY_BACKOFF_SECONDS", 0)
    _record(tmp_path)
    missing = azurite_entra.container("not-yet-created")
    folder = BlobFolder.parse(entra_env.folder_url("not-yet-created", "j/"))
    uploader = LiveUploader(tmp_path, folder, period_s=3600)
    with caplog.at_level(logging.INFO):
        assert uploader.sync() is False
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "\n" not in message
    assert message.startswith(f"live upload to {folder.url} failed (ResourceNotFoundError: ")
    assert message.endswith("retrying in 60 min")
    missing.create_container()
    try:
        assert uploader.sync() is True
        assert set(_blobs(missing)) == {
            "j/metrics.jsonl",
            "j/tensorboard/events.out.tfevents.1.node.1",
        }
    finally:
        missing.delete_container()


def _trainer(tmp_path, env_extra, **settings):
    config = tiny_config(tmp_path / "run", backend="local", **settings)
    log = open(tmp_path / "trainer.log", "w")  # noqa: SIM115 - a file: a pipe could fill up
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer", *to_flags(config)],
        cwd=REPO,
        env={**os.environ, **env_extra},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return process, tmp_path / "run", tmp_path / "trainer.log"


def test_a_real_run_uploads_while_it_trains_and_everything_at_a_sigterm_stop(
    tmp_path, azurite_entra, logs
):
    url = azurite_entra.folder_url(logs.container_name, "dev-7f3a/live/")
    process, run, log_path = _trainer(
        tmp_path,
        azurite_entra.env(),
        # One long epoch: nothing ends it but the signal.
        synthetic_size=8_000_000,
        epochs=1,
        log_every=1,
        metrics_upload_url=url,
        metrics_upload_minutes=0.01,
        profile_steps="3-3",  # its trace goes in a folder under tensorboard/
    )
    try:
        # A period's upload while training runs (the end-of-run upload has not happened yet).
        def steps_uploaded():
            if "dev-7f3a/live/metrics.jsonl" not in _blobs(logs):
                return False
            return b'"kind": "train"' in _content(logs, "dev-7f3a/live/metrics.jsonl")

        _wait(steps_uploaded, "an upload of logged steps during training")
        _wait(lambda: traces(run), "the profiler's trace")
        assert process.poll() is None, log_path.read_text()[-3000:]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, log_path.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log_path.read_text()
    assert "stopped by signal" in output and "WARNING live upload" not in output
    local = {
        path.relative_to(run).as_posix(): path.read_bytes()
        for path in [run / "metrics.jsonl", *(run / "tensorboard").rglob("*")]
        if path.is_file()
    }
    assert any(name.startswith("tensorboard/events.out.tfevents.") for name in local)
    assert any(name.startswith("tensorboard/profile/rank0_") for name in local)
    uploaded = {name.removeprefix("dev-7f3a/live/"): _content(logs, name) for name in _blobs(logs)}
    assert uploaded == local  # the last upload came after the files were closed


def test_an_unreachable_endpoint_is_one_warning_line_and_the_run_still_succeeds(
    tmp_path, azurite_entra
):
    url = f"https://127.0.0.1:{free_port()}/devstoreaccount1/logs/dev-7f3a/live/"
    process, run, log_path = _trainer(
        tmp_path, azurite_entra.env(), max_steps=4, metrics_upload_url=url
    )
    assert process.wait(timeout=300) == 0, log_path.read_text()[-3000:]
    lines = log_path.read_text().splitlines()
    warnings = [line for line in lines if "WARNING" in line]
    assert len(warnings) == 1, warnings  # the default period is longer than the run: the end
    assert warnings[0].startswith(f"[rank 0] WARNING live upload to {url} failed (")
    assert warnings[0].endswith("giving up: the run has ended")
    assert any(line.startswith("done: step 4") for line in lines)
    assert (run / "metrics.jsonl").exists()


def test_a_late_role_assignment_is_one_warning_naming_the_role_until_it_arrives(
    tmp_path, late_grants, caplog, monkeypatch
):
    """A late grant (tests/support/storage_grants.py): each period before it is one warning line
    that says which role is missing; the first period after it uploads everything."""
    from tests.support.fake_imds import IDENTITY
    from trainer.common.grant_wait import CONTRIBUTOR

    storage = late_grants.storage
    for name in [n for n in os.environ if n.startswith("AZURE_") and n != "AZURE_IMDS_URL"]:
        monkeypatch.delenv(name)
    for name, value in storage.env().items():
        monkeypatch.setenv(name, value)
    container = storage.container("late-live")
    container.create_container()
    try:
        _record(tmp_path)
        folder = BlobFolder.parse(storage.folder_url("late-live", "j/"))
        uploader = LiveUploader(tmp_path, folder, period_s=3600)
        with caplog.at_level(logging.INFO):
            assert uploader.sync() is False
        [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert "\n" not in warning
        assert "AuthorizationPermissionMismatch" in warning
        assert f"identity {IDENTITY} lacks {CONTRIBUTOR} on the storage account" in warning
        assert warning.endswith("retrying in 60 min")
        late_grants.grants.grant(IDENTITY)
        assert uploader.sync() is True
        assert set(_blobs(container)) == {
            "j/metrics.jsonl",
            "j/tensorboard/events.out.tfevents.1.node.1",
        }
    finally:
        container.delete_container()
