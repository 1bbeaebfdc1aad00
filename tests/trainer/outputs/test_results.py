"""``trainer.outputs.results`` and ``trainer.outputs.results_manifest``: the results folder's files
and manifest, what makes it complete, the ``outputs_url`` setting, and the upload's failure as one
line (Azurite over HTTPS with the managed identity's tokens, as on a node)."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.trainer.fs_faults import file_size_limit
from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import ConfigError
from trainer.common.files import OutputError, sha256_file
from trainer.models.build import build_model
from trainer.outputs import results
from trainer.outputs.results_manifest import ResultsError, parse_manifest, verify
from trainer.settings.train_config import TrainConfig


def _write(folder, model, **changes):
    values = dict(
        config=TrainConfig(model="tiny", num_classes=5).to_dict(),
        summary={"step": 4, "stopped_by": "max_steps", "last_metrics": {"loss": float("nan")}},
        evaluation=results.evaluation_summary(
            {"val_loss": 1.5, "val_accuracy": 0.25, "val_samples": 64}, 4, False, "images"
        ),
        weights_metadata={"format": "pt", "model": "tiny", "step": "4"},
    )
    weights = results.full_state_dict(model, sharded=False, is_root=True)
    return results.write(folder, weights, **{**values, **changes})


def test_a_folder_holds_loadable_weights_the_settings_and_a_manifest_of_every_file(tmp_path):
    model = build_model("tiny", 5).to(memory_format=torch.channels_last)  # strided weights
    entries = _write(tmp_path / "results", model)
    folder = tmp_path / "results"
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.yaml",
        "evaluation.json",
        "manifest.json",
        "metrics.json",
        "model.safetensors",
    ]
    assert verify(folder) == entries
    assert {e.name: e.sha256 for e in entries} == {
        p.name: sha256_file(p) for p in folder.iterdir() if p.name != "manifest.json"
    }
    fresh = build_model("tiny", 5)
    fresh.load_state_dict(load_file(folder / "model.safetensors"))  # strict: every key
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    config = TrainConfig.from_mapping(yaml.safe_load((folder / "config.yaml").read_text()))
    assert config == TrainConfig(model="tiny", num_classes=5)
    # A diverged loss is null: every JSON reader can parse the file.
    assert json.loads((folder / "metrics.json").read_text())["last_metrics"] == {"loss": None}
    assert json.loads((folder / "evaluation.json").read_text()) == {
        "step": 4,
        "unit": "images",
        "samples": 64,
        "loss": 1.5,
        "accuracy": 0.25,
    }


def test_a_language_models_evaluation_reports_perplexity():
    summary = results.evaluation_summary(
        {"val_loss": 2.0, "val_accuracy": 0.4, "val_samples": 1536}, 8, True, "tokens"
    )
    perplexity = summary.pop("perplexity")
    assert summary == {"step": 8, "unit": "tokens", "samples": 1536, "loss": 2.0}
    assert perplexity == pytest.approx(7.389056)  # e ** 2
    assert results.evaluation_summary(None, 8, True, "tokens")["samples"] == 0


def test_a_changed_or_missing_file_or_manifest_makes_the_folder_incomplete(tmp_path):
    folder = tmp_path / "results"
    _write(folder, build_model("tiny", 5))
    assert results.is_complete(folder)
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ResultsError, match=r"model\.safetensors: SHA-256 [0-9a-f]{64} "):
        verify(folder)
    _write(folder, build_model("tiny", 5))  # written again: complete again
    assert results.is_complete(folder)
    (folder / "metrics.json").unlink()
    assert not results.is_complete(folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(ResultsError, match=r"no manifest\.json: the results are incomplete"):
        verify(folder)


@pytest.mark.parametrize("fault", ["a folder where a file goes", "a full disk"])
def test_a_failed_write_is_one_line_and_leaves_no_manifest_nor_temp_file(tmp_path, fault):
    folder = tmp_path / "results"
    _write(folder, build_model("tiny", 5))
    if fault == "a full disk":
        refused = file_size_limit(4096)  # the weights are larger: EFBIG, as ENOSPC would be
    else:
        (folder / "metrics.json").unlink()
        (folder / "metrics.json").mkdir()  # its rename fails
        refused = contextlib.nullcontext()
    with refused, pytest.raises(OutputError) as caught:  # python -m trainer: exit 1, one line
        _write(folder, build_model("tiny", 5))
    message = str(caught.value)
    assert message.startswith(f"cannot write {folder}: ") and "\n" not in message
    assert not (folder / "manifest.json").exists()
    assert not list(folder.glob(".*"))


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        (b"[]", "not a schema 1 results manifest"),
        (b'{"schema": 1, "files": []}', "lists no files"),
        (
            b'{"schema": 1, "files": [{"name": "../x", "bytes": 1, "sha256": "'
            + b"0" * 64
            + b'"}]}',
            "file name '../x' is not a plain file name",
        ),
        (b'{"schema": 1, "files": [{"name": "a", "bytes": 1}]}', "missing 'sha256'"),
        (
            b'{"schema": 1, "files": [{"name": "a", "bytes": -1, "sha256": "' + b"0" * 64 + b'"}]}',
            "a: bytes=-1 is not a size",
        ),
        (b"\xff", "can't decode byte 0xff"),
    ],
)
def test_a_manifest_that_could_lead_a_reader_astray_is_refused_in_one_line(manifest, reason):
    with pytest.raises(ResultsError) as caught:
        parse_manifest(manifest, "https://a/outputs/j/manifest.json")
    message = str(caught.value)
    assert message.startswith("https://a/outputs/j/manifest.json: not a valid results manifest (")
    assert reason in message and "\n" not in message


def test_outputs_url_is_validated_like_the_metrics_url():
    with pytest.raises(
        ConfigError, match=r"^outputs_url='http://a\.blob\.core\.windows\.net/o/': "
    ):
        TrainConfig(outputs_url="http://a.blob.core.windows.net/o/")
    url = "https://a.blob.core.windows.net/outputs/dev-1/"
    assert TrainConfig.from_mapping({"outputs-url": url}).outputs_url == url


def test_an_upload_that_fails_is_one_line_naming_the_folder_and_where_the_results_are(
    tmp_path, entra_env, monkeypatch
):
    from trainer.common import blob_client

    monkeypatch.setattr(blob_client, "RETRY_BACKOFF_SECONDS", 0)
    folder = tmp_path / "results"
    _write(folder, build_model("tiny", 5))
    missing = BlobFolder.parse(entra_env.folder_url("no-such-container", "dev-1/"))
    with pytest.raises(ResultsError) as caught:
        results.upload(folder, missing)
    message = str(caught.value)
    assert message.startswith(f"outputs_url={missing.url}: cannot upload the results (")
    assert f"they are complete in {folder}" in message and "\n" not in message
