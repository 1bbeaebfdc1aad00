"""The checkpoint mirror (trainer.checkpoints.mirror) against Azurite over HTTPS with the managed
identity's bearer tokens (DefaultAzureCredential, as on a node; no keys): runs mirror their
checkpoints, a run whose checkpoints folder is lost resumes from the mirror, a corrupted mirrored
blob is skipped, an unreachable mirror never stops training."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil

import torch

from tests.conftest import tiny_config as base_config
from tests.support.ports import free_port
from trainer.checkpoints import single_file
from trainer.checkpoints.mirror import MANIFEST_SUFFIX, CheckpointMirror
from trainer.common import blob_client
from trainer.common.blob_folder import BlobFolder
from trainer.engines.local import LocalDist
from trainer.settings.train_config import DEFAULTS
from trainer.training.run import train


def tiny_config(output_dir, **extra):
    return DEFAULTS.replace(**base_config(output_dir, **{"backend": "local", **extra}))


def _blobs(container, prefix=""):
    return sorted(b.name for b in container.list_blobs(name_starts_with=prefix))


def _content(container, name):
    return container.download_blob(name).readall()


def _weights(output_dir):
    _, state = single_file.load_latest(output_dir / "checkpoints")
    return state["model"], state["optimizer"]


def _save(folder, step):
    state = {"step": step, "model": {"w": torch.full((4,), float(step))}}
    return single_file.save(folder, step, state, keep=100)


def test_a_run_mirrors_its_checkpoints_verified_and_keeps_the_newest_n(tmp_path, entra_env, logs):
    url = entra_env.folder_url(logs.container_name, "job-1/checkpoints/")
    # 8 steps per epoch: checkpoints at 3, 6, 8 (epoch end), 9, 12, 15, 16, 18 (the end).
    cfg = tiny_config(
        tmp_path, max_steps=18, checkpoint_every=3, checkpoint_mirror_url=url,
        checkpoint_mirror_keep=2,
    )  # fmt: skip
    assert train(cfg, LocalDist()).step == 18
    # A save while an upload is in flight replaces the one waiting (at most one in flight):
    # which older ones were mirrored depends on timing; the last, 18, always is, and only the
    # newest 2 mirrored are kept, each whole.
    manifests = [n for n in _blobs(logs) if n.endswith(MANIFEST_SUFFIX)]
    names = [n.removeprefix("job-1/checkpoints/").removesuffix(MANIFEST_SUFFIX) for n in manifests]
    assert len(names) == 2 and names[-1] == "step-000000018.pt", names
    expected = [f"job-1/checkpoints/{n}{suffix}" for n in names for suffix in ("", ".sha256")]
    assert _blobs(logs) == sorted(expected + manifests)
    local = tmp_path / "checkpoints"
    for name in names:
        manifest = json.loads(_content(logs, f"job-1/checkpoints/{name}{MANIFEST_SUFFIX}"))
        assert [e["name"] for e in manifest["files"]] == [f"{name}.sha256", name]
        mirrored = {}
        for entry in manifest["files"]:
            data = mirrored[entry["name"]] = _content(logs, f"job-1/checkpoints/{entry['name']}")
            assert (entry["size"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
            # --keep-checkpoints may have pruned the local copy by now (which older checkpoint
            # the mirror kept depends on timing); where it is still there, the bytes are its.
            if (local / entry["name"]).exists():
                assert data == (local / entry["name"]).read_bytes()
        # Whole: the checkpoint's bytes are the ones its own checksum file names.
        checksum = mirrored[f"{name}.sha256"].decode().strip()
        assert hashlib.sha256(mirrored[name]).hexdigest() == checksum
    assert entra_env.imds.tokens_issued >= 1  # the identity's token, not a key


def test_a_checkpoint_pruned_locally_mid_upload_leaves_no_blob_behind(tmp_path, entra_env, logs):
    """On a busy machine the run's local pruning can remove a checkpoint the mirror is still
    copying: its sidecar was uploaded, its file is gone. What was written goes again (no
    manifest would ever name it, so no prune would), and the newer checkpoints still mirror."""
    mirror = CheckpointMirror(BlobFolder.parse(entra_env.folder_url(logs.container_name, "p/")), 5)
    folder = tmp_path / "checkpoints"
    pruned = _save(folder, 12)
    pruned.unlink()  # as single_file.save's pruning would, the sidecar still there
    assert mirror.upload(pruned) is False
    assert _blobs(logs, "p/") == []
    assert mirror.upload(_save(folder, 18)) is True
    assert _blobs(logs, "p/") == sorted(
        f"p/step-000000018.pt{suffix}" for suffix in ("", ".sha256", MANIFEST_SUFFIX)
    )


def test_a_lost_checkpoints_folder_resumes_from_the_mirror_and_ends_as_an_uninterrupted_run(
    tmp_path, entra_env, logs, caplog
):
    url = entra_env.folder_url(logs.container_name, "run/")
    settings = dict(label_smoothing=0.1, checkpoint_mirror_url=url)
    train(tiny_config(tmp_path / "full", label_smoothing=0.1), LocalDist())
    first = train(tiny_config(tmp_path / "split", run_steps=11, **settings), LocalDist())
    assert (first.step, first.stopped_by) == (11, "run_steps")
    shutil.rmtree(tmp_path / "split" / "checkpoints")  # the file server is lost or replaced
    with caplog.at_level(logging.INFO, logger="trainer.checkpoints.mirror"):
        second = train(tiny_config(tmp_path / "split", **settings), LocalDist())
    assert (second.start_step, second.step) == (11, 24)
    assert any(
        r.getMessage().startswith("resuming from the mirror's step-000000011.pt")
        for r in caplog.records
    )
    full, split = _weights(tmp_path / "full"), _weights(tmp_path / "split")
    for name, tensor in full[0].items():
        assert torch.equal(tensor, split[0][name]), name
    assert torch.equal(
        torch.cat([s["momentum_buffer"].flatten() for s in full[1]["state"].values()]),
        torch.cat([s["momentum_buffer"].flatten() for s in split[1]["state"].values()]),
    )


def test_a_newer_local_checkpoint_wins_over_the_mirror(tmp_path, entra_env, logs, caplog):
    mirror = CheckpointMirror(BlobFolder.parse(entra_env.folder_url(logs.container_name, "m/")), 5)
    assert mirror.upload(_save(tmp_path / "a", 2))
    _save(tmp_path / "b", 3)
    with caplog.at_level(logging.INFO):
        assert mirror.fetch_newer(tmp_path / "b", 3, "pt") is None
    assert [s for s, _ in single_file.list_checkpoints(tmp_path / "b")] == [3]
    assert any("newest step 2; resuming from" in r.getMessage() for r in caplog.records)


def test_a_corrupted_mirrored_blob_is_skipped_with_a_warning(tmp_path, entra_env, logs, caplog):
    mirror = CheckpointMirror(BlobFolder.parse(entra_env.folder_url(logs.container_name, "m/")), 5)
    for step in (1, 2):
        assert mirror.upload(_save(tmp_path / "source", step))
    # A flipped byte in the newest mirrored checkpoint (storage, or someone's copy).
    data = bytearray(_content(logs, "m/step-000000002.pt"))
    data[len(data) // 2] ^= 0xFF
    logs.upload_blob("m/step-000000002.pt", bytes(data), overwrite=True)
    local = tmp_path / "lost" / "checkpoints"
    with caplog.at_level(logging.INFO):
        path = mirror.fetch_newer(local, -1, "pt")
    assert path == local / "step-000000001.pt"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "skipping mirrored checkpoint step-000000002.pt: step-000000002.pt does not match its "
        "SHA-256 in the manifest"
    ]
    # Only the verified one arrived, whole, and no temporary folder is left.
    assert sorted(p.name for p in local.iterdir()) == [
        "step-000000001.pt",
        "step-000000001.pt.sha256",
    ]
    assert single_file.load(path)["step"] == 1


def test_an_unreachable_mirror_is_one_warning_and_the_run_trains_and_resumes_locally(
    tmp_path, entra_env, monkeypatch, caplog
):
    monkeypatch.setattr(blob_client, "RETRY_BACKOFF_SECONDS", 0)
    url = f"https://127.0.0.1:{free_port()}/devstoreaccount1/checkpoints/run/"
    cfg = tiny_config(tmp_path, max_steps=4, checkpoint_every=2, checkpoint_mirror_url=url)
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoints.mirror"):
        assert train(cfg, LocalDist()).step == 4
        resumed = train(cfg.replace(max_steps=6), LocalDist())
    assert (resumed.start_step, resumed.step) == (4, 6)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings[0].startswith(f"checkpoint mirror {url} unreachable (")  # the first resume
    copies = [w for w in warnings if w.startswith("checkpoint mirror: cannot copy")]
    assert copies and all(w.endswith("the next checkpoint retries") for w in copies)
    assert len([w for w in warnings if "unreachable" in w]) == 2  # one per resume, no more
    assert all("\n" not in w for w in warnings)


def test_a_sharded_checkpoint_folder_is_mirrored_marker_last_and_fetched_whole(
    tmp_path, entra_env, logs
):
    """A ``step-N.dcp/`` folder (trainer.checkpoints.sharded's layout): every file, the
    ``complete`` marker last in the manifest; fetched into place as one folder, an incomplete
    local folder of that name replaced."""
    source = tmp_path / "source" / "step-000000004.dcp"
    (source / "sub").mkdir(parents=True)
    for name, data in {
        "__0_0.distcp": b"rank 0",
        "__1_0.distcp": b"rank 1",
        ".metadata": b"meta",
        "sub/x": b"nested",
        "trainer_state.pt": b"state",
        "complete": b"",
    }.items():
        (source / name).write_bytes(data)
    mirror = CheckpointMirror(BlobFolder.parse(entra_env.folder_url(logs.container_name, "s/")), 2)
    assert mirror.upload(source)
    manifest = json.loads(_content(logs, f"s/step-000000004.dcp{MANIFEST_SUFFIX}"))
    assert manifest["files"][-1]["name"] == "step-000000004.dcp/complete"
    local = tmp_path / "lost"
    (local / "step-000000004.dcp").mkdir(parents=True)  # a crash before its marker
    (local / "step-000000004.dcp" / "__0_0.distcp").write_bytes(b"half")
    assert mirror.fetch_newer(local, -1, "pt") is None  # another format's are not candidates
    assert mirror.fetch_newer(local, -1, "dcp") == local / "step-000000004.dcp"
    fetched = local / "step-000000004.dcp"
    assert {
        p.relative_to(fetched).as_posix(): p.read_bytes() for p in fetched.rglob("*") if p.is_file()
    } == {
        p.relative_to(source).as_posix(): p.read_bytes() for p in source.rglob("*") if p.is_file()
    }
    assert sorted(p.name for p in local.iterdir()) == ["step-000000004.dcp"]
