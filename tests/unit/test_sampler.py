import pytest

from trainer.data.sampler import ShardSampler


def shards(size, world, batch, epoch=0, skip=0):
    out = []
    for rank in range(world):
        sampler = ShardSampler(size, world, rank, batch, seed=7)
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
    sampler = ShardSampler(100, 2, 1, 8)
    sampler.set_epoch(5, skip_batches=1)
    items = list(sampler)
    assert len(items) == len(sampler) == 40
    assert {epoch for _, epoch in items} == {5}
