"""A job's own command on two simulated nodes (127.0.0.1, 127.0.0.2): the launchers start the
example torchrun script with torchrun's variables and DT_RUN_DIR, and the master copies the
script's metrics.jsonl and TensorBoard files to the logs container (Azurite over HTTPS, the
node identity's tokens), where dt-jobs metrics|tensorboard read them."""

from __future__ import annotations

import sys

import pytest

from tests.support.launchers import REPO
from tests.trainer.launch.launch_nodes import start_nodes

SCRIPT = [sys.executable, str(REPO / "examples" / "torchrun_ddp" / "train.py")]

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


def test_the_master_uploads_a_scripts_tensorboard_and_metrics_as_the_trainer_does(
    tmp_path, entra_env, logs
):
    run_dir = tmp_path / "run"
    url = entra_env.folder_url(logs.container_name, "job-1/live/")
    nodes = start_nodes(
        tmp_path,
        [*SCRIPT, "--steps", "4", "--checkpoint-every", "2"],
        "--metrics-upload-url",
        url,
        run_dir=run_dir,
        backend="torch",
    )
    codes = [node.wait(timeout=180) for node in nodes]
    output = "".join((tmp_path / f"node{i}.log").read_text() for i in range(2))
    assert codes == [0, 0], output
    assert "training steps 1..4 on 2 workers" in output
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step-00000002.pt",
        "step-00000004.pt",
    ]
    blobs = sorted(blob.name for blob in logs.list_blobs(name_starts_with="job-1/live/"))
    assert blobs[0] == "job-1/live/metrics.jsonl"
    assert any(name.startswith("job-1/live/tensorboard/events.out.tfevents.") for name in blobs)
    uploaded = logs.download_blob("job-1/live/metrics.jsonl").readall()
    assert uploaded == (run_dir / "metrics.jsonl").read_bytes()  # the last copy, after the end
    assert uploaded.decode().count('"kind": "train"') == 4
