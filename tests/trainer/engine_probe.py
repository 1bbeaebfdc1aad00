"""Run under horovodrun or torchrun: two checks of the engine's ranks that train nothing, in one
launch (starting two workers costs more than both checks).

Usage: engine_probe.py BACKEND REPORT_DIR. Each rank writes probe-<rank>.json with:

- ``horovod_env``: the cycle time and fusion buffer Horovod read at init, left to the engine.
- ``affinity``: ``select_device`` on the CPU with ``cpu_affinity`` off, then auto, after the
  engine has started its own threads (Horovod's background loop, Gloo's): its local rank and, for
  each setting, the CPUs every thread of the process may run on, then (after auto) those of a
  thread and of a child process started after the binding.
- ``vote``: the ranks' stop vote (``trainer.watch.signals.StopVote``) with other collectives
  in flight as a training step's would be. Rank 1 alone is asked to stop during step 2: what
  ``next()`` answered at each of 5 steps, the answer of a ``close()`` after them, and whether a
  separate ``any_rank_later`` read after other collectives saw rank 1's True.
"""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch
from rank_report import HOROVOD_KNOBS  # beside this script (on sys.path)

from trainer.engines.base import Dist
from trainer.engines.choose import init_dist
from trainer.engines.cpu_affinity import each_thread
from trainer.engines.device import select_device
from trainer.settings.train_config import TrainConfig
from trainer.watch.signals import StopRequest, StopVote

STEPS, SIGNALLED_DURING = 5, 2


def threads_cpus() -> dict[int, list[int]]:
    return each_thread(lambda thread: sorted(os.sched_getaffinity(thread)))


def affinity(backend: str, dist: Dist) -> dict:
    report: dict = {"local_rank": dist.local_rank, "local_size": dist.local_size}
    select_device(TrainConfig(backend=backend, device="cpu", cpu_affinity="off"), dist)
    report["off"] = threads_cpus()
    select_device(TrainConfig(backend=backend, device="cpu"), dist)
    report["auto"] = threads_cpus()
    later: list[list[int]] = []
    thread = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0))))
    thread.start()
    thread.join()
    report["later_thread"] = later[0]
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    report["child"] = json.loads(child.stdout)
    return report


def vote(dist: Dist) -> dict:
    stop = StopRequest()  # not installed: the "signal" is set by hand, on rank 1 only
    votes = StopVote(dist, stop)
    answers = []
    for step in range(1, STEPS + 1):
        # The step's own traffic (gradients, metrics) while the vote is in flight.
        summed = dist.allreduce_sum(torch.full((1000,), float(step)))
        assert summed[0].item() == step * dist.size
        dist.broadcast_object({"step": step})
        if dist.rank == 1 and step == SIGNALLED_DURING:
            stop.requested = True
        answers.append(votes.next())
    closed = votes.close()
    later = dist.any_rank_later(dist.rank == 1)
    dist.barrier()
    return {"answers": answers, "closed": closed, "later": later()}


def main() -> None:
    backend, report_dir = sys.argv[1], Path(sys.argv[2])
    dist = init_dist(TrainConfig(backend=backend, device="cpu"))
    report = {
        "horovod_env": {k: os.environ.get(k) for k in HOROVOD_KNOBS},
        "affinity": affinity(backend, dist),
        "vote": vote(dist),
    }
    dist.shutdown()
    (report_dir / f"probe-{dist.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
