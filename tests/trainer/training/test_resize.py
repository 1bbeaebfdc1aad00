"""Resume on another number of workers (a job replaced with fewer or more Spot nodes).

Two workers train into the middle of epoch 1 and stop with a checkpoint; the run is resumed
from it on one worker and, from a copy, on three, and trains to the end of epoch 2. Every rank
records the sample indices and the learning rate of each optimizer step it trained
(``sample_log.py``).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest

from tests.conftest import tiny_config
from tests.support.launchers import horovodrun, read_metrics, small_config, torchrun
from trainer.checkpoints import single_file
from trainer.data.sampler import RankSampler, StreamSampler
from trainer.data.shards import ShardSource
from trainer.settings.train_config import DEFAULTS

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

LAUNCHERS = {"horovod": horovodrun, "ddp": torchrun}
SIZE, BATCH, BASE_LR, WARMUP_EPOCHS, EPOCHS = 128, 8, 0.05, 1.5, 3
STEPS_PER_EPOCH = SIZE // (BATCH * 2)  # on 2 workers: 8


def launch(backend, workers, script, report_dir, config, cwd):
    command = LAUNCHERS[backend](script, str(report_dir), json.dumps(config), workers=workers)
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = [json.loads(p.read_text()) for p in sorted(report_dir.glob("rank-*.json"))]
    assert [r["size"] for r in reports] == [workers] * workers
    return result, reports


def expected_lr(rule, world, position):
    """The 2-worker run's settings on ``world`` workers: warmup from the base rate to the
    scaled peak over 1.5 epochs, then a cosine to the end of the run, in steps of this size."""
    peak = BASE_LR * {"linear": world, "sqrt": math.sqrt(world)}[rule]
    per_epoch = SIZE // (BATCH * world)
    warmup, total = round(WARMUP_EPOCHS * per_epoch), EPOCHS * per_epoch
    if position < warmup:
        return BASE_LR + (peak - BASE_LR) * position / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (position - warmup) / (total - warmup)))


def steps_of(reports, epoch):
    """Per global step (in order), every rank's record of it, for the steps of ``epoch``."""
    per_rank = [[s for s in r["steps"] if s["epoch"] == epoch] for r in reports]
    return list(zip(*per_rank, strict=True))


def newest_checkpoint(output_dir):
    found = single_file.load_latest(output_dir / "checkpoints")
    assert found is not None, f"no checkpoint in {output_dir}"
    return found[1]


def rates(records):
    return [r["lr"] for r in records]


@pytest.mark.parametrize(
    ("backend", "rule", "stop_at"),
    [
        # 3 steps (48 samples) into epoch 1: 80 left, on 3 workers 3 steps of 24 and 8 dropped.
        ("horovod", "linear", 11),
        # 7 steps (112 samples) into epoch 1: 16 left, on 3 workers no step, all 16 dropped.
        ("ddp", "sqrt", 15),
    ],
)
def test_resume_on_one_and_on_three_workers_continues_the_epoch_and_rescales_the_lr(
    backend, rule, stop_at, tmp_path, repo
):
    offset = (stop_at - STEPS_PER_EPOCH) * BATCH * 2
    script = str(repo / "tests" / "trainer" / "sample_log.py")
    settings = dict(
        backend=backend,
        batch_size=BATCH,
        synthetic_size=SIZE,
        epochs=EPOCHS,
        warmup_epochs=WARMUP_EPOCHS,
        lr=BASE_LR,
        lr_scaling=rule,
        lr_decay="cosine",
        log_every=1,
    )
    first = small_config(tmp_path / "out-1", run_steps=stop_at, **settings)
    _, old = launch(backend, 2, script, tmp_path / "old", first, repo)
    assert [r["step"] for r in old] == [stop_at, stop_at]
    saved = newest_checkpoint(tmp_path / "out-1")
    assert (saved["step"], saved["epoch"], saved["epoch_offset"]) == (stop_at, 1, offset)
    assert (saved["world_size"], saved["epoch_world_size"]) == (2, 2)
    # The recorded rates are the trainer's schedule on 2 workers: the test's formula is right.
    for step, records in enumerate(steps_of(old, 0) + steps_of(old, 1)):
        assert rates(records) == pytest.approx([expected_lr(rule, 2, step)] * 2)
    shutil.copytree(tmp_path / "out-1", tmp_path / "out-3")

    order = RankSampler(SIZE, 1, 0, 1, seed=DEFAULTS.seed)
    order.set_epoch(1)
    order = order.epoch_order()
    before = [i for records in steps_of(old, 1) for r in records for i in r["indices"]]
    assert sorted(before) == sorted(order[:offset])

    for workers in (1, 3):
        config = {**first, "output_dir": str(tmp_path / f"out-{workers}"), "run_steps": None}
        result, new = launch(backend, workers, script, tmp_path / f"new-{workers}", config, repo)
        global_batch = BATCH * workers
        per_epoch = SIZE // global_batch
        steps_left = (SIZE - offset) // global_batch
        tail = (SIZE - offset) % global_batch
        assert f"resized: checkpoint from 2 workers resumed on {workers}" in result.stderr
        assert f"at step {stop_at} (epoch 1)" in result.stdout
        end = stop_at + steps_left + per_epoch  # the rest of epoch 1, then epoch 2
        assert {(r["start_step"], r["step"], r["epoch"]) for r in new} == {(stop_at, end, EPOCHS)}

        # Within epoch 1, across both runs: each sample once, all but the tail of the order.
        resumed = steps_of(new, 1)
        assert len(resumed) == steps_left
        after = [i for records in resumed for r in records for i in r["indices"]]
        both = before + after
        assert len(both) == len(set(both)) == SIZE - tail
        assert sorted(both) == sorted(order[: SIZE - tail])
        for k, records in enumerate(resumed):  # global step k is the next run of the order
            start = offset + k * global_batch
            assert {i for r in records for i in r["indices"]} == set(
                order[start : start + global_batch]
            )
        # Epoch 2 is a whole epoch of the new size.
        last = [i for records in steps_of(new, 2) for r in records for i in r["indices"]]
        assert len(last) == len(set(last)) == per_epoch * global_batch

        # The rate: the schedule of the new size, at the same place in the epochs.
        position = 2 * per_epoch - steps_left
        continued = resumed + steps_of(new, 2)
        assert len(continued) == end - stop_at
        for k, records in enumerate(continued):
            expected = expected_lr(rule, workers, position + k)
            assert rates(records) == pytest.approx([expected] * workers)
        assert continued[0][0]["lr"] != pytest.approx(expected_lr(rule, 2, stop_at))

        # Metrics of the new size: rates per worker and in total, each epoch's end evaluated.
        records = read_metrics(tmp_path / f"out-{workers}")
        train = [r for r in records if r["kind"] == "train" and r["step"] > stop_at]
        assert [r["step"] for r in train] == list(range(stop_at + 1, end + 1))
        for record in train:
            assert record["images_per_sec_total"] == pytest.approx(
                record["images_per_sec"] * workers
            )
        assert [r["epoch"] for r in records if r["kind"] == "eval"] == [0, 1, 2]
        final = newest_checkpoint(tmp_path / f"out-{workers}")
        assert (final["step"], final["epoch"], final["epoch_offset"]) == (end, EPOCHS, 0)
        assert (final["world_size"], final["epoch_world_size"]) == (workers, workers)


def test_shard_stream_resumed_on_three_workers_continues_the_epoch_exactly(
    tmp_path, repo, prepared
):
    # 36 training samples in several shards. On 2 workers a rank reads its own run of 18,
    # 9 steps of 2 x 2; stop after 4 steps (16 samples). On 3 workers, the 20 left of the
    # 2-worker layout give 3 steps of 6 and 2 dropped.
    script = str(repo / "tests" / "trainer" / "sample_log.py")
    first = tiny_config(
        tmp_path / "out",
        backend="ddp",
        data="shards",
        data_dir=str(prepared),
        num_classes=3,
        batch_size=2,
        loader_workers=0,
        shuffle_buffer=4,
        epochs=1,
        log_every=1,
        run_steps=4,
    )
    _, old = launch("ddp", 2, script, tmp_path / "old", first, repo)
    result, new = launch("ddp", 3, script, tmp_path / "new", {**first, "run_steps": None}, repo)
    assert "resized: checkpoint from 2 workers resumed on 3" in result.stderr
    assert "read the 2-worker layout's rest across all its shards" in result.stderr
    assert {(r["start_step"], r["step"], r["epoch"]) for r in new} == {(4, 7, 1)}

    layout = StreamSampler(
        ShardSource(prepared, "train").shard_samples, 2, 0, 2, seed=DEFAULTS.seed, buffer=4
    )
    order = layout.epoch_order()
    before = [i for records in steps_of(old, 0) for r in records for i in r["indices"]]
    after = [i for records in steps_of(new, 0) for r in records for i in r["indices"]]
    assert len(before) == 16 and len(after) == 18
    assert len(set(before + after)) == 34
    assert sorted(before + after) == sorted(order[:34])
