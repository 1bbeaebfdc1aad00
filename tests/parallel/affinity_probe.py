"""Run under horovodrun or torchrun: ``select_device`` on the CPU with ``cpu_affinity`` off, then
auto, after the engine has started its own threads (Horovod's background loop, Gloo's).

Usage: affinity_probe.py BACKEND REPORT_DIR. Each rank writes affinity-<rank>.json: its local
rank and, for each setting, the CPUs every thread of the process may run on, then (after auto)
those of a thread and of a child process started after the binding.
"""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from trainer.affinity import thread_ids
from trainer.config import TrainConfig
from trainer.distributed import init_dist
from trainer.run import select_device


def threads_cpus() -> dict[int, list[int]]:
    cpus = {}
    for thread in thread_ids():
        try:
            cpus[thread] = sorted(os.sched_getaffinity(thread))
        except ProcessLookupError:  # a thread that ended since the listing
            continue
    return cpus


def main() -> None:
    backend, report_dir = sys.argv[1], Path(sys.argv[2])
    dist = init_dist(TrainConfig(backend=backend, device="cpu"))
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
    dist.barrier()
    dist.shutdown()
    (report_dir / f"affinity-{dist.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
