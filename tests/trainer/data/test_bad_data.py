"""Bad data met on the training path: a corrupt JPEG mid-training (``--on-bad-image``, folder and
shards, with and without a memory cache) and a flipped bit inside a shard (verified once per
node against the manifest's SHA-256)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from tests.conftest import make_dataset, tiny_config
from tests.trainer.data.conftest import shard_config, shard_settings
from tests.trainer.data.test_cache_scope import run_ranks
from trainer.checkpoints import single_file
from trainer.common.files import sha256_file
from trainer.data import DataError, build_loaders
from trainer.data import verify as verify_module
from trainer.data.manifest import MANIFEST_NAME, VERIFIED_NAME, Manifest, ShardEntry
from trainer.data.node_memory import NodeGroup
from trainer.data.shards import ShardSource
from trainer.data.verify import verify_shards
from trainer.engines.local import LocalDist
from trainer.settings.flags import to_flags
from trainer.settings.train_config import DEFAULTS, TrainConfig
from trainer.training.run import train

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[3]


def _truncate(jpeg: Path) -> None:
    """Cut a real JPEG short: its header reads, its pixels do not decode."""
    data = jpeg.read_bytes()
    assert data[:2] == b"\xff\xd8"
    jpeg.write_bytes(data[: len(data) * 2 // 3])


def corrupt_member(shards: Path, split: str, index: int) -> str:
    """Damage sample ``index``'s image inside its shard (its first bytes: no image format is
    recognised any more) and record the damaged shard in the manifest, as a shard written by a
    tool that did not check its images would be. Returns ``shard:key``."""
    source = ShardSource(shards, split)
    path = shards / source.shard_names[source.shard_ids[index]]
    with open(path, "r+b") as file:
        file.seek(int(source.offsets[index]))
        file.write(b"\x00garbage\x00" * 4)
    manifest = Manifest.load(shards)
    entry = manifest.splits[split]
    fixed = tuple(
        ShardEntry(s.name, s.bytes, s.samples, sha256_file(path)) if s.name == path.name else s
        for s in entry.shards
    )
    manifest.splits[split] = type(entry)(entry.samples, fixed, entry.skipped)
    (shards / MANIFEST_NAME).write_text(manifest.to_json())
    return source.describe(index)


def _shard_run(output: Path, shards: Path, **extra) -> TrainConfig:
    """A tiny one-process run on the small prepared dataset (``shards``)."""
    values = tiny_config(output, backend="local", epochs=1, warmup_epochs=0, log_every=2)
    return DEFAULTS.replace(**{**values, **shard_settings(shards), **extra})


def _batches(loaders) -> int:
    return sum(labels.numel() for _, labels in loaders.train)


@pytest.mark.parametrize("cache", ["none", "bytes", "decoded"])
def test_a_truncated_jpeg_in_a_folder_fails_naming_it_or_is_skipped_and_counted(
    image_folder, caplog, cache
):
    victim = sorted((image_folder / "train" / "class1").glob("*.JPEG"))[0]
    _truncate(victim)
    config = dict(
        data="folder",
        data_dir=str(image_folder),
        image_size=32,
        batch_size=3,
        num_classes=3,
        loader_workers=0,
        cache=cache,
    )
    if cache == "decoded":  # found while the cache fills: every rank stops before training
        with pytest.raises(DataError) as failure:
            build_loaders(DEFAULTS.replace(**config), 0, 1, CPU, False)
    else:
        loaders = build_loaders(DEFAULTS.replace(**config), 0, 1, CPU, False)
        with pytest.raises(DataError) as failure:
            _batches(loaders)
    message = str(failure.value)
    assert "\n" not in message and str(victim) in message
    assert "replace or delete that file" in message and "--on-bad-image skip" in message

    skip = DEFAULTS.replace(**config, on_bad_image="skip")
    loaders = build_loaders(skip, 0, 1, CPU, False)
    with caplog.at_level(logging.WARNING, logger="trainer.data.bad_images"):
        for epoch in range(2):
            loaders.train.set_epoch(epoch)
            assert _batches(loaders) == 18  # 6 full batches of 3: shapes kept
    assert loaders.bad_images.skipped == 2  # met once per epoch
    warnings = [r.getMessage() for r in caplog.records if str(victim) in r.getMessage()]
    assert len(warnings) == 1, warnings  # one warning per bad file, the first time


def test_a_corrupt_member_of_a_shard_is_named_by_shard_and_key(shards):
    where = corrupt_member(shards, "train", 5)
    loaders = build_loaders(shard_config(shards), 0, 1, CPU, False)
    with pytest.raises(DataError) as failure:
        _batches(loaders)
    message = str(failure.value)
    assert "\n" not in message and message.startswith(f"cannot decode image {where}: ")
    assert "prepare the shards again" in message and "--on-bad-image skip" in message
    skip = build_loaders(shard_config(shards, on_bad_image="skip"), 0, 1, CPU, False)
    assert _batches(skip) == 36 and skip.bad_images.skipped == 1


def test_a_corrupt_jpeg_with_loader_workers_exits_2_with_one_line_and_no_orphans(
    tmp_path, image_folder
):
    victim = sorted((image_folder / "train" / "class2").glob("*.JPEG"))[-1]
    _truncate(victim)
    config = tiny_config(
        tmp_path / "run",
        data="folder",
        data_dir=str(image_folder),
        num_classes=3,
        image_size=32,
        batch_size=3,
        loader_workers=2,
        epochs=1,
    )
    args = [sys.executable, "-m", "trainer", "--backend", "local", *to_flags(config)]
    process = subprocess.Popen(
        args,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its loader workers are found by their session afterwards
    )
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(victim) in errors[0], stderr[-3000:]
    assert "--on-bad-image skip" in errors[0]
    assert "Traceback" not in stderr and "DataLoader worker" not in stderr
    left = []
    for other in psutil.process_iter():
        try:
            # A zombie has exited; only its reaping is left (to init, once the run is gone).
            if os.getsid(other.pid) == process.pid and other.status() != psutil.STATUS_ZOMBIE:
                left.append(other)
        except (ProcessLookupError, psutil.Error):
            continue
    # The forkserver leaves as soon as it reads the run's end. Workers the run failed to stop
    # never leave (they and the forkserver keep each other alive: trainer/data/loaders.py), so
    # the bound only ends a wait that should never expire, however busy the machine.
    _, alive = psutil.wait_procs(left, timeout=60)
    assert alive == [], f"loader workers outlived the run: {alive}"
    assert single_file.list_checkpoints(tmp_path / "run" / "checkpoints") == []


def _flip_a_bit(shards: Path) -> Path:
    manifest = Manifest.load(shards)
    shard = shards / manifest.splits["train"].shards[1].name
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside a sample's bytes: size and tar headers unchanged
    shard.write_bytes(bytes(data))
    return shard


def test_a_flipped_bit_in_a_shard_stops_training_naming_the_shard(tmp_path, shards):
    shard = _flip_a_bit(shards)
    with pytest.raises(DataError) as failure:
        build_loaders(shard_config(shards), 0, 1, CPU, False)
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith(f"shard {shard} does not match its SHA-256 in ")
    assert "stage it again" in message
    with pytest.raises(DataError, match="does not match its SHA-256"):
        train(_shard_run(tmp_path / "run", shards), LocalDist())
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """The names of the shards ``verify`` hashes (the real hash, watched)."""
    names: list[str] = []

    def watched(path: Path) -> str:
        names.append(path.name)
        return sha256_file(path)

    monkeypatch.setattr(verify_module, "sha256_file", watched)
    return names


def test_a_shard_is_hashed_once_per_node_not_per_epoch_or_restart(tmp_path, shards, hashed):
    all_shards = [s.name for s in Manifest.load(shards).shards]
    cfg = _shard_run(tmp_path / "run", shards, epochs=2)
    train(cfg, LocalDist())  # two epochs
    assert sorted(hashed) == sorted(all_shards)
    recorded = json.loads((shards / VERIFIED_NAME).read_text())
    assert len(recorded) == len(all_shards)
    hashed.clear()
    build_loaders(cfg, 0, 1, CPU, False)  # what a restart on the same node does first
    assert hashed == []
    # A shard written since (its times change) is checked again, and only that one.
    shard = shards / all_shards[2]
    shard.write_bytes(shard.read_bytes())
    build_loaders(shard_config(shards), 0, 1, CPU, False)
    assert hashed == [shard.name]


def test_the_ranks_of_a_node_split_the_hashing_and_share_the_record(tmp_path, shards, hashed):
    manifest = Manifest.load(shards)

    def rank(dist):
        return verify_shards(shards, manifest.shards, NodeGroup.form(dist, tmp_path))

    counts = run_ranks(3, rank)
    assert all(isinstance(c, int) for c in counts), counts
    assert sorted(hashed) == sorted(s.name for s in manifest.shards)  # each shard once
    assert min(counts) >= 1 and sum(counts) == len(manifest.shards)
    hashed.clear()
    assert run_ranks(3, rank) == [0, 0, 0] and hashed == []


def test_a_flipped_bit_found_by_one_rank_stops_every_rank(tmp_path, shards):
    shard = _flip_a_bit(shards)
    manifest = Manifest.load(shards)

    def rank(dist):
        return verify_shards(shards, manifest.shards, NodeGroup.form(dist, tmp_path))

    results = run_ranks(2, rank)
    assert all(isinstance(r, DataError) and str(shard) in str(r) for r in results), results
    assert not (shards / VERIFIED_NAME).exists()


def test_a_folder_of_images_that_do_not_decode_is_one_error_not_a_search(tmp_path):
    root = make_dataset(tmp_path / "src", per_class=2)
    for image in (root / "train").rglob("*.*"):
        image.write_bytes(image.read_bytes()[:40])
    loaders = build_loaders(
        DEFAULTS.replace(
            data="folder",
            data_dir=str(root),
            image_size=32,
            batch_size=2,
            num_classes=3,
            loader_workers=0,
            on_bad_image="skip",
        ),
        0,
        1,
        CPU,
        False,
    )
    with pytest.raises(DataError, match=r"samples after it do not decode either") as failure:
        _batches(loaders)
    assert "\n" not in str(failure.value) and "cannot decode image" in str(failure.value)
