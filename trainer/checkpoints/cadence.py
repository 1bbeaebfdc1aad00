"""When a run checkpoints, the one rule: the ``Checkpointer`` follows it at every step, epoch end
and stop (it decides when as well as how), and the acceptance check expects the steps it gives.
Torch-free, so the tools around the program read it too."""

from __future__ import annotations

from enum import Enum


class Moment(Enum):
    """Where in a run a checkpoint may be due."""

    STEP = "step"  # an optimizer step ended
    EPOCH_END = "epoch end"  # an epoch ended (after its evaluation): the next epoch's start
    STOP = "stop"  # the run stops: its last step, --run-steps or a signal


def checkpoint_due(
    moment: Moment,
    step: int,
    *,
    every: int,
    written: int = -1,
    ends_epoch: bool = False,
    stops: bool = False,
) -> bool:
    """Whether the checkpoint of ``step`` is due at ``moment``:

    - after a step, every ``every`` steps (--checkpoint-every; 0: never), unless another
      checkpoint of this same step follows at once, the epoch's end (``ends_epoch``) or the
      run's stop (``stops``): written twice, the first would only be overwritten;
    - at an epoch's end, always: a resume starts the next epoch from it;
    - at the stop, unless ``written`` (the newest checkpoint the run wrote or resumed from) is
      this step's.
    """
    if moment is Moment.EPOCH_END:
        return True
    if moment is Moment.STOP:
        return written != step
    return every > 0 and step % every == 0 and not (ends_epoch or stops)


def checkpoint_steps(every: int, last: int, steps_per_epoch: int | None = None) -> list[int]:
    """The steps a run from step 0 to ``last``, uninterrupted, checkpoints at (``every``:
    --checkpoint-every; ``steps_per_epoch`` None: no epoch ends before ``last``), each once."""
    candidates = {last}
    if every > 0:
        candidates.update(range(every, last + 1, every))
    if steps_per_epoch:
        candidates.update(range(steps_per_epoch, last + 1, steps_per_epoch))
    steps: list[int] = []
    for step in sorted(candidates):
        ends_epoch = bool(steps_per_epoch) and step > 0 and step % steps_per_epoch == 0
        due = checkpoint_due(
            Moment.STEP, step, every=every, ends_epoch=ends_epoch, stops=step == last
        )
        if due or (ends_epoch and checkpoint_due(Moment.EPOCH_END, step, every=every)):
            steps.append(step)
    if checkpoint_due(Moment.STOP, last, every=every, written=steps[-1] if steps else -1):
        steps.append(last)
    return steps
