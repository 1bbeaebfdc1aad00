"""Run under torchrun: train with a memory cache, recording the shared memory it maps.

Usage: cache_report.py REPORT_DIR CONFIG_JSON. The trainer is wrapped from outside (its
``build_loaders``), so production code carries no measuring hook. When the first training batch
has arrived (every cache filled, the train loader's workers running), each rank reads the
/dev/shm-backed mappings of ``/proc/self/maps`` and of one of its loader workers, with each
file's inode, size and allocated bytes. Each rank writes rank-<N>.json with those, its pid,
the bytes its caches computed from the image headers, the samples they hold and a digest of its
final parameters.
"""

import json
import os
import sys
from pathlib import Path

from rank_report import params_sha256  # the sibling script (this folder is on sys.path)

import trainer.training.run
import trainer.training.setup
from trainer.data.node_memory import PREFIX
from trainer.engines.choose import init_dist
from trainer.settings.train_config import TrainConfig

_caches: dict = {}
_seen: dict = {}


def shm_mappings(pid: int) -> list[dict]:
    """One entry per distinct cache file a process maps (``/proc/<pid>/maps``)."""
    found = {}
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/dev/shm/" + PREFIX):
            continue
        path = fields[5].removesuffix(" (deleted)")
        stat = os.stat(path)
        found[int(fields[4])] = {
            "path": path,
            "inode": int(fields[4]),
            "size": stat.st_size,
            "allocated": stat.st_blocks * 512,
        }
    return list(found.values())


class MeasuringLoader:
    """The train loader; measures once, when its first batch has arrived."""

    def __init__(self, inner) -> None:
        self.inner, self.sampler = inner, inner.sampler

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        self.inner.set_epoch(epoch, skip_batches)

    def __len__(self) -> int:
        return len(self.inner)

    def stop_workers(self) -> None:
        self.inner.stop_workers()

    def __iter__(self):
        for batch in self.inner:
            if not _seen:
                workers = self.inner.loader._iterator._workers  # the DataLoader's processes
                _seen["rank"] = shm_mappings(os.getpid())
                _seen["worker"] = shm_mappings(workers[0].pid) if workers else []
            yield batch


def main() -> None:
    report_dir, config = Path(sys.argv[1]), TrainConfig.from_mapping(json.loads(sys.argv[2]))
    build_loaders = trainer.training.setup.build_loaders

    def measuring_build_loaders(*args, **kwargs):
        loaders = build_loaders(*args, **kwargs)
        for name, loader in (("train", loaders.train), ("val", loaders.val)):
            _caches[name] = loader.loader.dataset.source
        loaders.train = MeasuringLoader(loaders.train)
        return loaders

    trainer.training.setup.build_loaders = measuring_build_loaders
    dist = init_dist(config)
    result = trainer.training.run.train(config, dist)
    report = {
        "rank": dist.rank,
        "size": dist.size,
        "pid": os.getpid(),
        "step": result.step,
        "params_sha256": params_sha256(result.model),
        "computed": {name: int(cache.offsets[-1]) for name, cache in _caches.items()},
        "cached": {
            name: [int(i) for i in (cache.slots >= 0).nonzero()[0]]
            for name, cache in _caches.items()
        },
        "rank_maps": _seen["rank"],
        "worker_maps": _seen["worker"],
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / f"rank-{dist.rank}.json").write_text(json.dumps(report))
    dist.shutdown()


if __name__ == "__main__":
    main()
