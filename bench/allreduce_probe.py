"""Run under horovodrun or torchrun: time an allreduce of a ResNet-18-sized gradient (47 MB) the
way the trainer's engine runs it, and print the median milliseconds on rank 0. Started by
bench.allreduce."""

from __future__ import annotations

import statistics
import sys
import time

import torch

from trainer.engines.base import Dist
from trainer.engines.ddp import TorchDist
from trainer.engines.horovod import HorovodDist

GRADIENT_BYTES = 11_689_512 * 4  # ResNet-18's parameters in fp32 (with 1000 classes)
TIMED = 20  # allreduces timed after one untimed (Horovod negotiates a name in full only once)


def main() -> None:
    engine = sys.argv[1]
    torch.set_num_threads(1)
    tensor = torch.ones(GRADIENT_BYTES // 4)
    # The trainer's own engine set-up: for Horovod its cycle time and fusion buffer for Gloo on
    # CPUs; for torch.distributed its Gloo group.
    dist: Dist
    if engine == "horovod":
        dist = HorovodDist()
        import horovod.torch as hvd  # initialised by HorovodDist

        def allreduce() -> None:
            # In place under one name, the caller waiting in synchronize: the path
            # DistributedOptimizer takes every step (the out-of-place hvd.allreduce would time a
            # 47 MB allocation per call too; a new name each call, a full negotiation).
            hvd.synchronize(hvd.allreduce_async_(tensor, op=hvd.Sum, name="probe"))
    else:
        dist = TorchDist()
        import torch.distributed as td

        def allreduce() -> None:
            td.all_reduce(tensor)

    times = []
    for _ in range(TIMED + 1):
        started = time.perf_counter()
        allreduce()
        times.append(time.perf_counter() - started)
    if dist.rank == 0:
        print(f"{statistics.median(times[1:]) * 1e3:.1f}")
    dist.shutdown()  # the trainer's own exit: no Gloo thread left running at teardown


if __name__ == "__main__":
    main()
