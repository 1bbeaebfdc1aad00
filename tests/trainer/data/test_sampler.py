import pytest

from trainer.data.sampler import RankSampler, StreamSampler


def shards(size, world, batch, epoch=0, skip=0):
    out = []
    for rank in range(world):
        sampler = RankSampler(size, world, rank, batch, seed=7)
        sampler.set_epoch(epoch, skip)
        out.append([index for index, _ in sampler])
    return out


@pytest.mark.parametrize(("size", "world", "batch"), [(100, 2, 8), (103, 3, 5), (64, 4, 16)])
def test_ranks_get_disjoint_equal_full_batch_shares(size, world, batch):
    parts = shards(size, world, batch)
    assert len({len(p) for p in parts}) == 1
    assert len(parts[0]) == (size // world) // batch * batch
    flat = [i for p in parts for i in p]
    assert len(flat) == len(set(flat))
    assert all(0 <= i < size for i in flat)


def test_order_is_deterministic_per_epoch_and_changes_between_epochs():
    assert shards(100, 2, 8, epoch=3) == shards(100, 2, 8, epoch=3)
    assert shards(100, 2, 8, epoch=3) != shards(100, 2, 8, epoch=4)


def test_resume_mid_epoch_continues_the_same_order():
    full = shards(100, 2, 8, epoch=1)
    resumed = shards(100, 2, 8, epoch=1, skip=2)
    assert [p[16:] for p in full] == resumed


def test_epoch_travels_with_each_index_and_len_counts_what_is_left():
    sampler = RankSampler(100, 2, 1, 8)
    sampler.set_epoch(5, skip_batches=1)
    items = list(sampler)
    assert len(items) == len(sampler) == 40
    assert {epoch for _, epoch in items} == {5}


def epoch_order(size, epoch, seed=7):
    sampler = RankSampler(size, 1, 0, 1, seed=seed)
    sampler.set_epoch(epoch)
    return sampler.epoch_order()


def batches(make, world, epoch, **position):
    """Each rank's batches (lists of indices) from ``make(rank)`` positioned by ``position``."""
    out = []
    for rank in range(world):
        sampler = make(rank)
        sampler.set_epoch(epoch, **position)
        indices = sampler.rank_indices()
        assert len(indices) == len(sampler) == sampler.batches_left * sampler.batch_size
        size = sampler.batch_size
        out.append([indices[i : i + size] for i in range(0, len(indices), size)])
    return out


def global_batches(per_rank):
    """Global batch k as the set of every rank's batch k."""
    return [set().union(*group) for group in zip(*per_rank, strict=True)]


def test_offset_is_skip_batches_in_samples():
    for rank in (0, 1):
        by_skip = RankSampler(100, 2, rank, 8, seed=7)
        by_skip.set_epoch(1, 3)
        by_offset = RankSampler(100, 2, rank, 8, seed=7)
        by_offset.set_epoch(1, offset=3 * 8 * 2)
        assert by_skip.rank_indices() == by_offset.rank_indices()
        assert len(by_skip) == len(by_offset) == (6 - 3) * 8
    with pytest.raises(ValueError, match="not both"):
        by_offset.set_epoch(1, 2, offset=32)


def test_global_batch_k_is_the_kth_contiguous_run_of_the_epoch_order():
    order = epoch_order(100, 2)
    per_rank = batches(lambda r: RankSampler(100, 2, r, 8, seed=7), 2, 2)
    for k, together in enumerate(global_batches(per_rank)):
        assert together == set(order[k * 16 : (k + 1) * 16])


@pytest.mark.parametrize(
    ("size", "batch", "accumulation", "old_world", "steps_done", "new_world"),
    [
        (128, 8, 1, 2, 3, 1),
        (128, 8, 1, 2, 3, 3),  # 128 - 48 = 80 left: 3 steps of 24, a tail of 8
        (100, 5, 1, 2, 7, 3),  # 100 - 70 = 30 left: 2 steps of 15, no tail
        (103, 4, 2, 2, 2, 3),  # 103 - 32 = 71 left: 2 steps of 24 (2 x 4 x 3), a tail of 23
        (97, 4, 1, 3, 5, 2),  # shrinking from an odd size, a tail of 1
    ],
)
def test_resume_on_another_world_size_continues_the_epoch_exactly(
    size, batch, accumulation, old_world, steps_done, new_world
):
    order = epoch_order(size, 4)
    offset = steps_done * accumulation * batch * old_world
    old = batches(lambda r: RankSampler(size, old_world, r, batch, seed=7), old_world, 4)
    trained = [i for rank in old for b in rank[: steps_done * accumulation] for i in b]
    new = batches(
        lambda r: RankSampler(size, new_world, r, batch, seed=7), new_world, 4, offset=offset
    )
    assert len({len(rank) for rank in new}) == 1  # every rank takes the same steps
    steps_left = len(new[0]) // accumulation
    assert steps_left == (size - offset) // (accumulation * batch * new_world)
    resumed = [i for rank in new for b in rank[: steps_left * accumulation] for i in b]
    assert sorted(trained) == sorted(order[:offset])
    assert len(set(trained + resumed)) == len(trained) + len(resumed)  # none seen twice
    used = offset + len(resumed)
    assert sorted(trained + resumed) == sorted(order[:used])  # none skipped but the tail
    assert size - used == (size - offset) % (accumulation * batch * new_world)
    for k, together in enumerate(global_batches(new)):
        start = offset + k * batch * new_world
        assert together == set(order[start : start + batch * new_world])


def stream(rank, world, **extra):
    return StreamSampler([7, 5, 9, 6, 8], world, rank, 3, seed=2, buffer=4, **extra)


def test_stream_order_at_its_own_world_size_is_each_ranks_own_block():
    for world in (1, 2, 3):
        interleaved = stream(0, world).epoch_order()
        for rank in range(world):
            sampler = stream(rank, world)
            mine = sampler.rank_indices()
            assert mine == interleaved[rank::world][: len(mine)]
            # Offsets that are not a multiple of the world size take the general path.
            sampler.set_epoch(0, offset=world * 3 + 1)
            assert (
                sampler.rank_indices()
                == interleaved[world * 3 + 1 + rank :: world][: sampler.batches_left * 3]
            )


def test_stream_resume_on_another_world_size_twice_in_one_epoch_is_exact():
    # 35 samples. 2 workers (17 each in the layout, 1 never read): 2 steps of 6 -> offset 12.
    # 3 workers: 22 left of 34, 2 steps of 9 -> offset 30. 1 worker: 4 left, 1 step of 3.
    epoch = 5
    layout = stream(0, 2)
    layout.set_epoch(epoch)
    order = layout.epoch_order()
    assert len(order) == layout.order_length == 34
    trained = []
    offset = 0
    for world, steps in ((2, 2), (3, 2), (1, 1)):
        per_rank = batches(
            lambda r, w=world: stream(r, w), world, epoch, offset=offset, layout_replicas=2
        )
        for rank in per_rank:
            for b in rank[:steps]:
                trained.extend(b)
        offset += steps * 3 * world
    assert offset == 33
    assert len(trained) == len(set(trained)) == 33
    assert sorted(trained) == sorted(order[:33])
    # The layout of the epoch the run began on, not of the new size, decides the order.
    assumed, layout = stream(0, 3), stream(0, 3)
    assumed.set_epoch(epoch, offset=12)
    layout.set_epoch(epoch, offset=12, layout_replicas=2)
    assert assumed.rank_indices() != layout.rank_indices()


def test_a_rest_smaller_than_a_global_batch_leaves_no_steps():
    # 2 workers trained 7 of 8 steps (offset 112 of 128); 16 left do not fill 3 x 8.
    sampler = RankSampler(128, 3, 2, 8, seed=7)
    sampler.set_epoch(0, offset=112)
    assert (sampler.batches_left, len(sampler), sampler.rank_indices()) == (0, 0, [])
    sampler.set_epoch(0, offset=500)
    assert sampler.batches_left == 0


def test_a_synthetic_epoch_with_no_samples_left_yields_no_batch():
    import torch

    from trainer.data.synthetic import SyntheticLoader

    sampler = RankSampler(8, num_replicas=2, rank=0, batch_size=2)
    loader = SyntheticLoader(
        sampler, pool=4, image_size=4, num_classes=3, device=torch.device("cpu"), seed=0
    )
    loader.set_epoch(0, skip_batches=sampler.batches_per_epoch)  # the whole epoch was trained
    assert list(loader) == []
