"""Run under horovodrun (two workers) with a cycle time far longer than any operation here takes
(HOROVOD_CYCLE_TIME) and a 1 MB fusion threshold (HOROVOD_FUSION_THRESHOLD): rank 0 writes to the
file named by its argument how long, in seconds, the background loop took to run
- ``waited``: allreduces whose caller waits for each in ``hvd.synchronize``;
- ``full_buffer``: allreduces of more than the fusion threshold, polled without waiting;
- ``small_done_early``: whether an allreduce far below the threshold, polled without waiting for
  ``SMALL_POLL_SECONDS``, was done before then (the loop keeps its cycle for everything else).
With the wake-on-wait patch the first two take milliseconds; without it each waits for the next
tick of the cycle."""

from __future__ import annotations

import json
import sys
import time

import horovod.torch as hvd
import torch

SMALL_POLL_SECONDS = 1.0
FLOATS_PER_MB = 1024 * 1024 // 4


def waited() -> float:
    tensor = torch.ones(1024)
    started = time.perf_counter()
    for index in range(5):
        hvd.synchronize(hvd.allreduce_async_(tensor, op=hvd.Sum, name=f"waited.{index}"))
    return time.perf_counter() - started


def poll_until_done(handles: list[int], seconds: float) -> bool:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if all(hvd.poll(handle) for handle in handles):
            return True
        time.sleep(0.005)
    return False


def full_buffer() -> float:
    # 1.5 MB, over the threshold, enqueued at once (one by one, the tensors after the one that
    # crossed it could fall into the next cycle's count).
    tensors = [torch.ones(FLOATS_PER_MB // 2) for _ in range(3)]
    started = time.perf_counter()
    handle = hvd.grouped_allreduce_async_(tensors, op=hvd.Sum, name="full")
    poll_until_done([handle], seconds=60.0)
    took = time.perf_counter() - started
    hvd.synchronize(handle)
    return took


def small_done_early() -> bool:
    tensor = torch.ones(1024)
    handle = hvd.allreduce_async_(tensor, op=hvd.Sum, name="small")
    done = poll_until_done([handle], SMALL_POLL_SECONDS)
    hvd.synchronize(handle)  # the waiter wakes the loop: done now
    return done


hvd.init()
report = {"waited": waited(), "full_buffer": full_buffer(), "small_done_early": small_done_early()}
if hvd.rank() == 0:
    with open(sys.argv[1], "w") as out:
        json.dump(report, out)
hvd.shutdown()
