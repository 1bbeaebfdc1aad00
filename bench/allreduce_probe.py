"""Run under horovodrun or torchrun: time an allreduce of a ResNet-18-sized gradient (47 MB)
and print the median milliseconds on rank 0. Used by bench.scaling to explain its figures."""

from __future__ import annotations

import statistics
import sys
import time

import torch

GRADIENT_BYTES = 11_689_512 * 4  # ResNet-18's parameters in fp32 (with 1000 classes)


def main() -> None:
    engine = sys.argv[1]
    torch.set_num_threads(1)
    tensor = torch.ones(GRADIENT_BYTES // 4)
    if engine == "horovod":
        import horovod.torch as hvd

        hvd.init()
        rank = hvd.rank()

        def allreduce(name: str) -> None:
            # In place, the caller waiting in synchronize: the path DistributedOptimizer takes
            # (the out-of-place hvd.allreduce would time a 47 MB allocation per call too).
            hvd.synchronize(hvd.allreduce_async_(tensor, op=hvd.Sum, name=name))
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()

        def allreduce(name: str) -> None:
            dist.all_reduce(tensor)

    times = []
    for i in range(6):
        started = time.perf_counter()
        allreduce(f"probe.{i}")
        times.append(time.perf_counter() - started)
    if rank == 0:
        print(f"{statistics.median(times[1:]) * 1e3:.1f}")
    # Leave the group before the interpreter ends: a Gloo thread still running at teardown
    # aborts the process ("terminate called without an active exception").
    if engine == "horovod":
        hvd.shutdown()
    else:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
