"""Run under horovodrun or torchrun: train, recording what every optimizer step consumed.

Usage: sample_log.py REPORT_DIR CONFIG_JSON. The trainer is wrapped from outside (its train
loader and ``trainer.training.steps.train_step``), so production code carries no recording hook.
Each rank writes rank-<N>.json: its world size, the step it started and ended at, and per optimizer
step the epoch, the learning rate the step used and the sample indices of its micro-batches.
"""

import json
import logging
import sys
from pathlib import Path

import torch

import trainer.training.run
import trainer.training.setup
import trainer.training.steps
from trainer.engines.choose import init_dist
from trainer.settings.train_config import TrainConfig

_pending: list[tuple[int, list[int]]] = []  # (epoch, indices) of batches handed to the loop
_steps: list[dict] = []


class RecordingLoader:
    """The train loader, noting the indices of each batch it hands out."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.sampler = inner.sampler

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        self.inner.set_epoch(epoch, skip_batches)

    def __len__(self) -> int:
        return len(self.inner)

    def stop_workers(self) -> None:
        self.inner.stop_workers()

    def __iter__(self):
        _pending.clear()  # a trailing group short of accumulation_steps was never trained
        # The same deterministic list the loader itself reads from.
        indices = self.sampler.rank_indices()
        size = self.sampler.batch_size
        for n, (images, labels) in enumerate(self.inner):
            batch = indices[n * size : (n + 1) * size]
            self._check(batch, images, labels)
            _pending.append((self.sampler.epoch, batch))
            yield images, labels

    def _check(self, batch: list[int], images: torch.Tensor, labels: torch.Tensor) -> None:
        """The recorded indices are the ones the tensors came from."""
        if hasattr(self.inner, "images"):  # synthetic: rows of a fixed pool
            rows = torch.tensor(batch) % self.inner.images.shape[0]
            assert torch.equal(images, self.inner.images[rows]), batch
        else:
            source = self.inner.loader.dataset.source
            assert labels.tolist() == [source.label(i) for i in batch], batch


def main() -> None:
    report_dir, config = Path(sys.argv[1]), TrainConfig.from_mapping(json.loads(sys.argv[2]))
    build_loaders, train_step = (
        trainer.training.setup.build_loaders,
        trainer.training.steps.train_step,
    )

    def recording_build_loaders(*args, **kwargs):
        loaders = build_loaders(*args, **kwargs)
        loaders.train = RecordingLoader(loaders.train)
        return loaders

    def recording_train_step(parts, micro_batches):
        taken = [_pending.pop(0) for _ in micro_batches]
        _steps.append(
            {
                "epoch": taken[0][0],
                "lr": parts.optimizer.param_groups[0]["lr"],
                "indices": [index for _, batch in taken for index in batch],
            }
        )
        return train_step(parts, micro_batches)

    trainer.training.setup.build_loaders = recording_build_loaders
    trainer.training.steps.train_step = recording_train_step
    dist = init_dist(config)
    logging.basicConfig(level=logging.WARNING if dist.rank else logging.INFO)  # as __main__
    result = trainer.training.run.train(config, dist)
    report = {
        "rank": dist.rank,
        "size": dist.size,
        "start_step": result.start_step,
        "step": result.step,
        "epoch": result.epoch,
        "steps": _steps,
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / f"rank-{dist.rank}.json").write_text(json.dumps(report))
    dist.shutdown()


if __name__ == "__main__":
    main()
