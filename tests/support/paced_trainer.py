"""Run under horovodrun or torchrun: ``dt-train`` with some ranks' batches arriving late.

Usage: paced_trainer.py RANKS SECONDS TRAINER_FLAGS... The ranks RANKS (a rank's number,
``every`` or ``none``) sleep SECONDS before each training batch, as a rank reading from a slow
disk or a starved loader would. A run paced on every rank has steps that take wall time at
almost no CPU: slow enough to land a signal mid-epoch. The trainer itself runs unchanged
(``trainer.__main__.main``), so its records and last lines are the real ones.
"""

import sys
import time

import trainer.training.run
import trainer.training.setup
from trainer.__main__ import main


class SlowBatches:
    """A training loader whose every batch arrives ``seconds`` late; the rest is the loader's."""

    def __init__(self, inner, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def __iter__(self):
        for batch in self.inner:
            time.sleep(self.seconds)
            yield batch

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def slowed(build_loaders, ranks: str, seconds: float):
    def build(cfg, rank, *args, **kwargs):
        loaders = build_loaders(cfg, rank, *args, **kwargs)
        if ranks == "every" or ranks == str(rank):
            loaders.train = SlowBatches(loaders.train, seconds)
        return loaders

    return build


if __name__ == "__main__":
    ranks, seconds = sys.argv[1], float(sys.argv[2])
    trainer.training.setup.build_loaders = slowed(
        trainer.training.setup.build_loaders, ranks, seconds
    )
    sys.exit(main(sys.argv[3:]))
