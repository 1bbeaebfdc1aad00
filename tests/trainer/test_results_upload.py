"""A finished run's results in Blob storage and back: ``python -m trainer --outputs-url`` uploads
them as rank 0 does on a node (Azurite over HTTPS, the managed identity's tokens, no keys), and
``python -m infra.tools.ops fetch`` downloads them with DefaultAzureCredential, verified."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from infra.tools import ops
from tests.conftest import tiny_config
from trainer.cli import to_flags

REPO = Path(__file__).resolve().parents[2]


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
        assert ops.main(argv) == 0
        assert {p.name: p.read_bytes() for p in dest.iterdir()} == local
        # Every file the manifest lists, checked against it.
        assert f"{len(local) - 1} file(s)" in capsys.readouterr().out
    finally:
        outputs.delete_container()
