"""A finished run's results in Blob storage and back: ``python -m trainer --outputs-url`` uploads
them as rank 0 does on a node (Azurite over HTTPS, the managed identity's tokens, no keys), and
``dt-jobs fetch`` downloads them with DefaultAzureCredential, verified."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dt_commands.jobs import main as dt_jobs
from tests.conftest import act_as_identity_of, tiny_config
from trainer.settings.flags import to_flags

REPO = Path(__file__).resolve().parents[3]


def _run_trainer(config: dict) -> subprocess.CompletedProcess[str]:
    """``python -m trainer`` as rank 0 on a node: the identity in its environment (entra_env)."""
    return subprocess.run(
        [sys.executable, "-m", "trainer", *to_flags(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_finished_run_uploads_its_results_which_fetch_downloads_verified(
    tmp_path, entra_env, capsys
):
    outputs = entra_env.container("outputs-results-e2e")
    outputs.create_container()
    url = entra_env.folder_url(outputs.container_name, "dev-tiny-0123456789/")
    run = tmp_path / "run"
    try:
        done = _run_trainer(tiny_config(run, backend="local", max_steps=2, outputs_url=url))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"results uploaded to {url}" in done.stdout
        local = {p.name: p.read_bytes() for p in (run / "results").iterdir()}
        assert set(local) == {
            "config.yaml",
            "evaluation.json",
            "manifest.json",
            "metrics.json",
            "model.safetensors",
        }

        stack = tmp_path / "outputs.json"
        job = {"job_id": "dev-tiny-0123456789", "outputs_url": url}
        stack.write_text(json.dumps({"jobs": {"tiny": job}}))
        dest = tmp_path / "fetched"
        argv = ["fetch", "--stack", "dev", "--outputs-file", str(stack), "--to", str(dest)]
        assert dt_jobs.main(argv) == 0
        assert {p.name: p.read_bytes() for p in dest.iterdir()} == local
        # Every file the manifest lists, checked against it.
        assert f"{len(local) - 1} file(s)" in capsys.readouterr().out
    finally:
        outputs.delete_container()


def test_the_results_upload_waits_out_a_late_role_assignment(tmp_path, late_grants_on, monkeypatch):
    """Storage refuses the identity (403 AuthorizationPermissionMismatch,
    tests/support/storage_grants.py) for 3 minutes after the run ends: the upload waits, one line
    per wait, then uploads; with the role never granted it fails in one line naming it."""
    from tests.support.fake_imds import IDENTITY
    from tests.support.storage_grants import FakeClock
    from tests.trainer.outputs.test_results import _write
    from trainer.common.blob_folder import BlobFolder
    from trainer.common.grant_wait import CONTRIBUTOR, GrantWait
    from trainer.models.build import build_model
    from trainer.outputs import results
    from trainer.outputs.results_manifest import ResultsError

    clock = FakeClock()
    late = late_grants_on(clock)
    act_as_identity_of(late.storage, monkeypatch)
    folder = tmp_path / "results"
    _write(folder, build_model("tiny", 5))
    outputs = late.storage.container("late-outputs")
    outputs.create_container()
    lines: list[str] = []
    wait = GrantWait(CONTRIBUTOR, log=lines.append, sleep=clock.advance, clock=clock)
    destination = BlobFolder.parse(late.storage.folder_url("late-outputs", "dev-1/"))
    try:
        with pytest.raises(ResultsError) as caught:
            results.upload(folder, destination, grant_wait=wait)
        assert f"identity {IDENTITY} lacks {CONTRIBUTOR} on the storage account" in str(
            caught.value
        )
        assert len(lines) == 30 and "\n" not in str(caught.value)

        late.grants.grant(IDENTITY, after_s=180)
        lines.clear()
        wait = GrantWait(CONTRIBUTOR, log=lines.append, sleep=clock.advance, clock=clock)
        entries = results.upload(folder, destination, grant_wait=wait)
        assert len(lines) == 3
        names = {b.name for b in outputs.list_blobs()}
        assert names == {f"dev-1/{e.name}" for e in entries} | {"dev-1/manifest.json"}
    finally:
        outputs.delete_container()
