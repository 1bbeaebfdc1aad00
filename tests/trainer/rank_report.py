"""Run under horovodrun or torchrun: train, then write what this rank ended with.

Usage: rank_report.py REPORT_DIR CONFIG_JSON. Each rank writes rank-<N>.json with its world size,
a digest of its parameters and the averaged metrics it holds, so a test can compare ranks.
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from trainer.engines.base import exit_without_teardown
from trainer.engines.choose import init_dist
from trainer.engines.cpu_affinity import each_thread
from trainer.settings.train_config import TrainConfig
from trainer.training.run import train

HOROVOD_KNOBS = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD")


def params_sha256(model) -> str:
    """A digest of every parameter's name and bytes: equal on ranks that hold the same model.
    FSDP's shards are gathered first (a collective: every rank calls this)."""
    return named_tensors_sha256(
        (name, param.full_tensor() if hasattr(param, "full_tensor") else param)
        for name, param in model.named_parameters()
    )


def named_tensors_sha256(named) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    report_dir, config = Path(sys.argv[1]), TrainConfig.from_mapping(json.loads(sys.argv[2]))
    dist = init_dist(config)
    result = train(config, dist)
    report = {
        "rank": dist.rank,
        "size": dist.size,
        "step": result.step,
        "params_sha256": params_sha256(result.model),
        "metrics": result.last_metrics,
        "mesh": list(dist.mesh.shape) if hasattr(dist, "mesh") else None,
        # What Horovod read at init (set from the config unless the environment had them).
        "horovod_env": {k: os.environ.get(k) for k in HOROVOD_KNOBS},
    }
    dist.shutdown()
    # The engine's threads end at shutdown, even while the run's DDP module is still referenced
    # here (as a caller's variable or a traceback's frame holds it): a group kept alive by it
    # would be destroyed later while holding the GIL (a hang) or in interpreter teardown (an
    # abort).
    report["threads_after_shutdown"] = threads_left_after_shutdown(config.backend)
    del result
    (report_dir / f"rank-{dist.rank}.json").write_text(json.dumps(report))
    if not dist.teardown_safe:  # as dt-train ends (trainer.engines.base.exit_without_teardown)
        exit_without_teardown(0)


def threads_left_after_shutdown(backend: str, seconds: float = 5.0) -> list[str] | None:
    """The threads still alive ``seconds`` after shutdown returned ([] as soon as none is).
    Gloo's TCP loop thread ends on its own once the connections it serves are closed, a moment
    after the group is destroyed; what matters is that it ends before interpreter teardown.
    Measured for DDP only, where the tests assert it. For the others waiting would spend the
    whole deadline on every run, unasserted: three threads of a Horovod process are still alive
    5 s after ``hvd.shutdown()``, and FSDP's Gloo threads outlive its shutdown (its groups are
    still referenced then: by its device mesh, its background group and, after training, from
    outside Python)."""
    if backend != "ddp":
        return None
    deadline = time.monotonic() + seconds
    while (left := native_threads()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def native_threads() -> list[str]:
    """The names of this process's threads other than the main one (Python's and C++'s)."""
    names = each_thread(lambda thread: Path(f"/proc/self/task/{thread}/comm").read_text().strip())
    return sorted(name for thread, name in names.items() if thread != os.getpid())


if __name__ == "__main__":
    main()
