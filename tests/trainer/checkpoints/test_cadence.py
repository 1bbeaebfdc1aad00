"""When a run checkpoints: the one rule (trainer.checkpoints.cadence) and the ``Checkpointer``
that follows it, deciding when as well as how."""

import pytest
import torch

from trainer.checkpoints.cadence import Moment, checkpoint_due, checkpoint_steps
from trainer.checkpoints.single_file import SingleFileCheckpointer, list_checkpoints
from trainer.engines.local import LocalDist
from trainer.models.build import build_model
from trainer.settings.train_config import DEFAULTS
from trainer.training.optim import build_optimizer


def test_a_step_is_checkpointed_every_n_steps_unless_the_same_steps_follows_at_once():
    assert checkpoint_due(Moment.STEP, 6, every=3)
    assert not checkpoint_due(Moment.STEP, 7, every=3)
    assert not checkpoint_due(Moment.STEP, 6, every=0)  # --checkpoint-every 0: none
    # The epoch's end or the run's stop writes this same step at once: one write, not two.
    assert not checkpoint_due(Moment.STEP, 6, every=3, ends_epoch=True)
    assert not checkpoint_due(Moment.STEP, 6, every=3, stops=True)


def test_an_epoch_end_is_always_checkpointed_and_a_stop_unless_written_already():
    assert checkpoint_due(Moment.EPOCH_END, 8, every=0)
    assert checkpoint_due(Moment.EPOCH_END, 8, every=3)
    assert checkpoint_due(Moment.STOP, 7, every=0, written=6)
    assert not checkpoint_due(Moment.STOP, 7, every=0, written=7)


@pytest.mark.parametrize(
    ("every", "last", "steps_per_epoch", "expected"),
    [
        (10, 20, None, [10, 20]),  # the acceptance presets
        (0, 20, None, [20]),
        (7, 20, None, [7, 14, 20]),
        (4, 16, 8, [4, 8, 12, 16]),  # every 4 lands on the epochs' ends: once each
        (3, 16, 8, [3, 6, 8, 9, 12, 15, 16]),
        (0, 16, 8, [8, 16]),
        (5, 13, 8, [5, 8, 10, 13]),
    ],
)
def test_the_steps_a_whole_run_checkpoints_at(every, last, steps_per_epoch, expected):
    assert checkpoint_steps(every, last, steps_per_epoch) == expected


def test_the_checkpointer_writes_only_when_a_checkpoint_is_due(tmp_path):
    cfg = DEFAULTS.replace(
        model="tiny",
        num_classes=5,
        output_dir=str(tmp_path),
        checkpoint_every=2,
        keep_checkpoints=10,
    )
    torch.manual_seed(0)
    model = build_model("tiny", 5)
    optimizer = build_optimizer(cfg, model)
    checkpointer = SingleFileCheckpointer(
        cfg,
        LocalDist(),
        model,
        optimizer,
        lambda: {"config": cfg.to_dict()},
        device=torch.device("cpu"),
    )
    try:
        assert checkpointer.save(1) is None
        assert checkpointer.save(2) is not None
        assert checkpointer.save(4, ends_epoch=True) is None  # the epoch's end writes step 4
        assert checkpointer.save(4, Moment.EPOCH_END) is not None
        assert checkpointer.save(4, Moment.STOP) is None  # written already: waited for
        assert checkpointer.save(5, stops=True) is None
        assert checkpointer.save(5, Moment.STOP) is not None
    finally:
        checkpointer.close()
    assert [step for step, _ in sorted(list_checkpoints(tmp_path / "checkpoints"))] == [2, 4, 5]
