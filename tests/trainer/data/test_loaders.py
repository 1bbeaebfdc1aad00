import psutil
import pytest
import torch

from tests.trainer.data.conftest import shard_config
from trainer.data import DataError, build_loaders
from trainer.data.cache import MemoryCache
from trainer.data.dataset import ImageDataset
from trainer.data.folder import FolderSource
from trainer.data.manifest import Manifest
from trainer.data.node_memory import SHM_DIR
from trainer.data.plugin_loaders import plugin_loaders
from trainer.data.sampler import StreamSampler
from trainer.data.shards import ShardSource
from trainer.settings.train_config import DEFAULTS

CPU = torch.device("cpu")


def test_shard_source_serves_the_original_bytes_and_labels(shards, dataset):
    source, folder = ShardSource(shards, "train"), FolderSource(dataset / "train")
    assert len(source) == len(folder) == 36
    for index in range(len(source)):
        assert source.read(index) == folder.read(index)
        assert source.label(index) == folder.label(index)


def test_stream_sampler_gives_each_rank_a_disjoint_run_of_shards_reshuffled_per_epoch():
    sizes = [5, 5, 5, 5, 5, 5]
    samplers = [StreamSampler(sizes, 2, rank, 3, seed=1, buffer=4) for rank in (0, 1)]
    epoch0 = [set(s.rank_indices()) for s in samplers]
    assert not epoch0[0] & epoch0[1]
    assert all(len(ranked) == 15 for ranked in epoch0)  # 5 batches of 3 per rank
    for sampler in samplers:
        sampler.set_epoch(1)
    epoch1 = [sampler.rank_indices() for sampler in samplers]
    assert [set(e) for e in epoch1] != epoch0
    # A rank's block touches about half the shards, not all of them.
    assert len({index // 5 for index in epoch1[0]}) <= 4


def test_stream_sampler_resume_reads_exactly_what_remained():
    full = StreamSampler([7, 7, 7], 1, 0, 2, seed=3, buffer=5)
    full.set_epoch(2)
    resumed = StreamSampler([7, 7, 7], 1, 0, 2, seed=3, buffer=5)
    resumed.set_epoch(2, skip_batches=4)
    assert resumed.rank_indices() == full.rank_indices()[8:]
    assert len(resumed) == len(full) - 8


def test_loader_trains_from_shards_in_both_ranks(shards):
    seen = []
    for rank in (0, 1):
        loaders = build_loaders(shard_config(shards), rank, 2, CPU, False)
        images, labels = next(iter(loaders.train))
        assert images.shape == (4, 3, 32, 32) and set(labels.tolist()) <= {0, 1, 2}
        assert loaders.val is not None and loaders.batches_per_epoch == 18 // 4
        seen.append({index for index, _ in loaders.train.sampler})
    assert not seen[0] & seen[1]


def test_bytes_cache_gives_identical_batches_and_decoded_cache_close_ones(shards):
    batches = {}
    for cache in ("none", "bytes", "decoded"):
        loader = build_loaders(shard_config(shards, cache=cache), 0, 1, CPU, False).val
        assert loader is not None
        batches[cache] = [images for images, _ in loader]
    for plain, cached in zip(batches["none"], batches["bytes"], strict=True):
        assert torch.equal(plain, cached)
    # Decoded pixels are stored at the validation resize already: the same crop, same pixels.
    for plain, cached in zip(batches["none"], batches["decoded"], strict=True):
        assert torch.allclose(plain, cached, atol=0.05)


def test_decoded_cache_holds_downscaled_pixels_in_shared_memory(tmp_path):
    from tests.conftest import make_dataset

    src = make_dataset(tmp_path / "big", per_class=2, size=120)
    cache = MemoryCache(FolderSource(src / "train"), "decoded", 32, workers=0)
    path = cache.segment.path
    assert path.parent == SHM_DIR and path.stat().st_size == cache.offsets[-1] == cache.data.numel()
    short = round(32 * 256 / 224)
    assert all(min(int(h), int(w)) == short for h, w in cache.shapes)
    dataset = ImageDataset(cache, 32, train=True, seed=0)
    assert dataset[(0, 0)][0].shape == (3, 32, 32)
    cache.close()
    assert not path.exists()


def test_cache_larger_than_free_memory_is_refused_before_filling(shards, monkeypatch):
    class Tiny:
        available = 10_000

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tiny)
    source = ShardSource(shards, "train")
    with pytest.raises(DataError, match=r"cache=bytes: 36 images need .* GiB \(one copy for the"):
        MemoryCache(source, "bytes", 32, workers=0)
    # Rank scope, no collectives: this rank's part counted once for each rank on the node.
    part = range(0, len(source), 2)
    with pytest.raises(DataError, match=r"cache=bytes: 36 images need .* GiB \(8 rank\(s\)"):
        MemoryCache(source, "bytes", 32, workers=0, ranks_per_node=8, indices=part)


def test_a_shard_that_does_not_match_the_manifest_is_named(shards):
    name = Manifest.load(shards).splits["train"].shards[1].name
    with open(shards / name, "ab") as file:
        file.write(b"\0" * 512)
    with pytest.raises(DataError, match=rf"shard .*{name} has \d+ bytes, the manifest says"):
        build_loaders(shard_config(shards), 0, 1, CPU, False)
    (shards / name).unlink()
    with pytest.raises(DataError, match=rf"{name} is listed in manifest.json but missing"):
        build_loaders(shard_config(shards), 0, 1, CPU, False)


def test_missing_manifest_says_how_to_make_one(tmp_path):
    with pytest.raises(DataError, match=r"manifest.json does not exist: prepare the dataset"):
        build_loaders(shard_config(tmp_path), 0, 1, CPU, False)


def test_trainer_runs_on_shards_with_the_decoded_cache(tmp_path, shards):
    import json
    import subprocess
    import sys

    from tests.trainer.data.test_bad_data import corrupt_member

    # Piggy-backed on this run: a damaged member, replaced and counted (--on-bad-image skip).
    damaged = corrupt_member(shards, "train", 7)
    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--backend",
            "local",
            "--data",
            "shards",
            "--data-dir",
            str(shards),
            "--cache",
            "decoded",
            "--model",
            "tiny",
            "--num-classes",
            "3",
            "--image-size",
            "16",
            "--batch-size",
            "6",
            "--epochs",
            "2",
            "--warmup-epochs",
            "1",
            "--loader-workers",
            "2",
            "--on-bad-image",
            "skip",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "done: step 12 (started at 0, stopped by epochs)" in result.stdout
    # Once per epoch; one warning line for the file, the first time it was met.
    assert "skipped 2 image(s) that did not decode" in result.stdout
    assert result.stderr.count(damaged) == 1, result.stderr[-2000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_images"] for r in records if r["kind"] == "train"][-1] == 2
    assert (out / "metrics.jsonl").exists()


def _plugin_set(size):
    return [(torch.zeros(3), 0)] * size


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            {"synthetic_size": 40},
            "synthetic_size=40: its samples give no full batch of 8 per worker for 8 workers: "
            "raise it to at least 64",
        ),
        (
            {"model": "gpt-tiny", "synthetic_size": 40},
            "synthetic data: 40 windows of 128 tokens give no full batch of 8 per worker for 8 "
            "workers: lower --batch-size or --context, or add text",
        ),
        (
            {"data": "team_data.sets:build"},
            "data=team_data.sets:build: its train set's 40 samples give no full batch of 8 per "
            "worker for 8 workers: lower --batch-size",
        ),
    ],
)
def test_data_without_a_full_batch_per_worker_is_one_line_with_the_fix(settings, line):
    cfg = DEFAULTS.replace(batch_size=8, **settings)
    with pytest.raises(DataError) as raised:
        if cfg.plugin_data:
            plugin_loaders(cfg, _plugin_set(40), None, 0, 8, CPU)
        else:
            build_loaders(cfg, 0, 8, CPU, False)
    assert str(raised.value) == line
