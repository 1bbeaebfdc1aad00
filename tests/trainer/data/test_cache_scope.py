"""--cache-scope: the fixed per-rank parts of the samplers, and the shared-memory cache (one
copy per node filled by the node's ranks, or each rank its part) with its cleanup."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading

import pytest
import torch

from tests.conftest import make_dataset
from tests.trainer.data.conftest import shard_config
from trainer.data import DataError, build_loaders
from trainer.data.cache import MemoryCache
from trainer.data.folder import FolderSource
from trainer.data.node_memory import (
    PREFIX,
    NodeGroup,
    Segment,
    host_tag,
    own_prefix,
    remove_stale,
)
from trainer.data.sampler import PartSampler, RankSampler, StreamSampler
from trainer.data.shards import ShardSource

CPU = torch.device("cpu")
N, WORLD, BATCH = 103, 3, 4  # 34 a rank, 1 dropped; 8 batches, 2 samples of a part unread


def epochs(sampler: RankSampler, count: int = 3) -> list[list[int]]:
    out = []
    for epoch in range(count):
        sampler.set_epoch(epoch)
        out.append(sampler.rank_indices())
    return out


@pytest.mark.parametrize(
    "make",
    [
        lambda rank: PartSampler(N, WORLD, rank, BATCH, seed=5),
        # Shards of 7 samples (the last 5): a rank's part is a fixed run of shards.
        lambda rank: StreamSampler(
            [7] * 14 + [5], WORLD, rank, BATCH, seed=5, buffer=6, fixed_parts=True
        ),
    ],
    ids=["folder", "shards"],
)
def test_rank_parts_are_disjoint_fixed_and_cover_all_but_the_tail(make):
    samplers = [make(rank) for rank in range(WORLD)]
    parts = [sampler.part() for sampler in samplers]
    assert all(len(part) == N // WORLD for part in parts)
    assert not set(parts[0]) & set(parts[1]) and not set(parts[1]) & set(parts[2])
    assert len(set().union(*parts)) == N - N % WORLD
    for sampler, part in zip(samplers, parts, strict=True):
        read = epochs(sampler)
        # Every epoch reads only its part, a full epoch's batches of it, in a new order.
        assert all(set(epoch) <= set(part) for epoch in read)
        assert all(len(epoch) == BATCH * (N // WORLD // BATCH) for epoch in read)
        assert read[0] != read[1] != read[2]
        assert sampler.part() == part  # the same part whatever epoch it is asked in
    # The same (seed, epoch) gives the same stream; another seed other parts.
    assert epochs(make(1)) == epochs(samplers[1])
    assert (
        PartSampler(N, WORLD, 0, BATCH, seed=6).part()
        != PartSampler(N, WORLD, 0, BATCH, seed=5).part()
    )


def test_shard_parts_are_runs_of_whole_shards_but_at_the_cuts():
    sampler = StreamSampler([10] * 12, 3, 1, 4, seed=2, buffer=8, fixed_parts=True)
    shards = {index // 10 for index in sampler.part()}
    assert len(shards) == 4  # 40 samples = four whole shards (the cuts fall on shard ends)
    plain = StreamSampler([10] * 12, 3, 1, 4, seed=2, buffer=8)
    assert plain.part() is None  # without fixed parts a rank's shards change every epoch


@pytest.mark.parametrize("fixed", [PartSampler, StreamSampler])
def test_resume_at_an_offset_reads_the_rest_of_the_same_stream(fixed):
    def make():
        if fixed is PartSampler:
            return PartSampler(N, WORLD, 2, BATCH, seed=1)
        return StreamSampler([7] * 14 + [5], WORLD, 2, BATCH, seed=1, buffer=6, fixed_parts=True)

    full, resumed = make(), make()
    full.set_epoch(4)
    resumed.set_epoch(4, skip_batches=3)
    assert resumed.rank_indices() == full.rank_indices()[3 * BATCH :]
    resumed.set_epoch(4, offset=3 * BATCH * WORLD)
    assert resumed.rank_indices() == full.rank_indices()[3 * BATCH :]


def test_rank_parts_resumed_on_another_worker_count_finish_the_epoch_then_split_anew():
    # Two workers stop 5 global batches (40 samples) into epoch 1; three take over.
    old = PartSampler(N, 2, 0, BATCH, seed=3)
    old.set_epoch(1)
    order = old.epoch_order()
    new = [PartSampler(N, 3, rank, BATCH, seed=3) for rank in range(3)]
    for sampler in new:
        sampler.set_epoch(1, offset=40, layout_replicas=2)
    rest = [i for sampler in new for i in sampler.rank_indices()]
    assert sorted(rest) == sorted(order[40 : 40 + len(rest)])
    assert len(rest) == (len(order) - 40) // (BATCH * 3) * BATCH * 3
    # From the next epoch on, each reads its part of the 3-worker split, what its cache holds.
    for sampler in new:
        sampler.set_epoch(2)
        assert set(sampler.rank_indices()) <= set(sampler.part())
    assert [s.part() for s in new] != [PartSampler(N, 2, r, BATCH, seed=3).part() for r in (0, 1)]


@pytest.mark.parametrize("mode", ["bytes", "decoded"])
def test_a_rank_cache_holds_its_part_and_serves_others_exactly_as_cached(mode, tmp_path):
    source = FolderSource(make_dataset(tmp_path / "data", per_class=4, size=70) / "train")
    whole = MemoryCache(source, mode, 32, workers=0)
    part = [1, 4, 5, 9]
    mine = MemoryCache(source, mode, 32, workers=0, indices=part)
    assert mine.data.numel() == sum(int(whole.offsets[i + 1] - whole.offsets[i]) for i in part)
    assert [i for i in range(len(source)) if mine.cached(i)] == part
    for index in range(len(source)):  # a hit or a miss, the same bytes or pixels
        if mode == "bytes":
            assert mine.read(index) == whole.read(index) == source.read(index)
        assert torch.equal(mine.pixels(index), whole.pixels(index))


def test_a_pickled_cache_maps_the_same_memory_not_a_copy(tmp_path):
    source = FolderSource(make_dataset(tmp_path / "data", per_class=2) / "train")
    cache = MemoryCache(source, "decoded", 32, workers=0)
    twin = pickle.loads(pickle.dumps(cache))  # what a forkserver loader worker receives
    assert twin.segment.path == cache.segment.path and not twin.segment.owner
    twin.data[0] = (int(cache.data[0]) + 1) % 256
    assert int(cache.data[0]) == int(twin.data[0])
    del twin  # a worker's copy never removes the segment
    assert cache.segment.path.exists()
    cache.close()
    assert not cache.segment.path.exists()


def test_a_segment_left_by_a_killed_run_is_removed_by_the_next_one(tmp_path):
    # A process that creates a segment and dies by SIGKILL: nothing of it can clean up.
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys; from pathlib import Path; "
            "from trainer.data.node_memory import Segment, own_prefix; "
            "kept = Segment.create(Path(sys.argv[1]) / (own_prefix() + '-train'), 4096); "
            "os.kill(os.getpid(), signal.SIGKILL)",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (orphan,) = tmp_path.glob(PREFIX + "-*")
    host = host_tag()
    assert orphan.name.startswith(f"{PREFIX}-{host}-") and orphan.stat().st_size == 4096
    others = {
        "alive": f"{PREFIX}-{host}-{os.getpid()}-abc123-train",
        "other host": f"{PREFIX}-00000000-{orphan.name.split('-')[3]}-abc123-train",
        "not ours": "torch_123_456",
    }
    for name in others.values():
        (tmp_path / name).write_bytes(b"x")
    segment = Segment.create(tmp_path / f"{own_prefix()}-val", 10)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*others.values(), segment.path.name])
    assert remove_stale(tmp_path) == []
    segment.close()


class ThreadRanks:
    """``allgather_object`` for ranks that are threads of this process (a test double)."""

    def __init__(self, size: int) -> None:
        self.size, self.box, self.barrier = size, [None] * size, threading.Barrier(size)

    def dist(self, rank: int):
        ranks = self

        class Dist:
            def __init__(self) -> None:
                self.rank = rank

            def allgather_object(self, obj):
                ranks.box[rank] = obj
                ranks.barrier.wait()
                out = list(ranks.box)
                ranks.barrier.wait()
                return out

        return Dist()


def run_ranks(size: int, work) -> list:
    ranks, results = ThreadRanks(size), [None] * size

    def one(rank: int) -> None:
        try:
            results[rank] = work(ranks.dist(rank))
        except Exception as err:
            results[rank] = err

    threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_a_node_cache_is_one_segment_filled_by_every_rank(tmp_path, monkeypatch):
    source = FolderSource(make_dataset(tmp_path / "data", per_class=5, size=60) / "train")
    reads = []
    original = FolderSource.read
    monkeypatch.setattr(
        FolderSource,
        "read",
        lambda self, i: reads.append((threading.get_ident(), i)) or original(self, i),
    )

    def rank(dist):
        group = NodeGroup.form(dist, tmp_path)
        return MemoryCache(source, "decoded", 32, workers=0, group=group)

    caches = run_ranks(3, rank)
    assert all(isinstance(c, MemoryCache) for c in caches), caches
    paths = {c.segment.path for c in caches}
    assert len(paths) == 1 and [c.segment.owner for c in caches] == [True, False, False]
    alone = MemoryCache(source, "decoded", 32, workers=0)
    assert torch.equal(caches[1].data, alone.data)
    # Each sample was read twice (header, pixels) by one rank only: the ranks split the work.
    by_sample = {}
    for thread, index in reads[: 2 * len(source)]:
        by_sample.setdefault(index, set()).add(thread)
    assert all(len(threads) == 1 for threads in by_sample.values())
    assert len({t for threads in by_sample.values() for t in threads}) == 3
    caches[0].close()
    assert not paths.pop().exists()


def test_a_bad_image_on_one_rank_fails_every_rank_and_leaves_no_segment(tmp_path):
    root = make_dataset(tmp_path / "data", per_class=4)
    bad = sorted((root / "train" / "class2").iterdir())[-1]
    bad.write_bytes(b"not an image")
    source = FolderSource(root / "train")

    def rank(dist):
        return MemoryCache(
            source,
            "decoded",
            32,
            workers=0,
            group=NodeGroup.form(dist, tmp_path),
        )

    results = run_ranks(2, rank)
    assert all(isinstance(r, DataError) for r in results), results
    assert all(str(bad) in str(r) for r in results)
    assert list(tmp_path.glob(PREFIX + "*")) == []


def test_node_scope_counts_one_copy_and_names_the_shared_memory_limit(tmp_path, monkeypatch):
    import trainer.data.cache as cache_module

    source = FolderSource(make_dataset(tmp_path / "data", per_class=2) / "train")
    monkeypatch.setattr(cache_module, "free_bytes", lambda directory: 100)
    with pytest.raises(
        DataError,
        match=r"cache=bytes: 6 images need .*\(one copy for the node's 1 rank\(s\)\) but "
        r".* has 0.0 GiB free: give the container more shared memory",
    ):
        MemoryCache(source, "bytes", 32, workers=0, group=NodeGroup.alone(tmp_path))
    assert list(tmp_path.glob(PREFIX + "*")) == []


def test_rank_scope_loaders_cache_each_rank_its_fixed_run_of_shards(shards):
    config = shard_config(shards, cache="decoded", cache_scope="rank")
    held = []
    for rank in (0, 1):
        loaders = build_loaders(config, rank, 2, CPU, False)
        cache = loaders.train.loader.dataset.source
        mine = {i for i in range(len(cache)) if cache.cached(i)}
        for epoch in (0, 1):
            loaders.train.set_epoch(epoch)
            assert {index for index, _ in loaders.train.sampler} <= mine
            assert sum(labels.numel() for _, labels in loaders.train) == 16
        held.append(mine)
    assert not held[0] & held[1] and len(held[0] | held[1]) == len(ShardSource(shards, "train"))


def test_rank_caches_check_the_parts_of_every_rank_before_any_allocates(tmp_path, monkeypatch):
    source = FolderSource(make_dataset(tmp_path / "data", per_class=4, size=60) / "train")
    parts = [range(0, 12, 2), range(1, 12, 2)]

    def rank(dist):
        group = NodeGroup.form(dist, tmp_path)
        return MemoryCache(source, "bytes", 32, 0, group=group, indices=parts[dist.rank])

    caches = run_ranks(2, rank)
    assert all(c.segment.owner for c in caches)  # each rank its own file
    assert len({c.segment.path for c in caches}) == 2
    both = sum(c.data.numel() for c in caches)
    assert both == sum(source.encoded_size(i) for i in range(len(source)))
    for cache in caches:
        cache.close()

    class Free:  # room for one rank's part, not for both
        available = int(both * 0.8 / 0.9)

    monkeypatch.setattr("psutil.virtual_memory", lambda: Free)
    results = run_ranks(2, rank)
    assert all(
        isinstance(r, DataError) and "the parts of the node's 2 ranks" in str(r) for r in results
    ), results
    assert list(tmp_path.glob(PREFIX + "*")) == []
