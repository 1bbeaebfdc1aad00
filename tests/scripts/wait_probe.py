"""Run under horovodrun (two workers): rank 1 joins an allreduce only after a pause, and rank 0,
already waiting in ``hvd.synchronize``, writes to the file named by its argument how much CPU
its waiting thread used while it waited ("cpu"), and its whole process ("process_cpu": Horovod's
background thread too, whose cycles a busy machine stretches).
A spinning wait burns about one core for the whole pause; a blocking one almost nothing."""

from __future__ import annotations

import json
import sys
import time

import horovod.torch as hvd
import torch

PAUSE_SECONDS = 2.0

hvd.init()
tensor = torch.ones(1024)
hvd.allreduce_(tensor, op=hvd.Sum, name="warmup")  # both ranks up, the background loop running
if hvd.rank() == 1:
    time.sleep(PAUSE_SECONDS)
tensor.fill_(1.0)
started_wall, started_cpu, started_process = (
    time.perf_counter(),
    time.thread_time(),
    time.process_time(),
)
handle = hvd.allreduce_async_(tensor, op=hvd.Sum, name="late")
hvd.synchronize(handle)
wall = time.perf_counter() - started_wall
cpu = time.thread_time() - started_cpu
process_cpu = time.process_time() - started_process
if hvd.rank() == 0:
    with open(sys.argv[1], "w") as report:
        figures = {"wall": wall, "cpu": cpu, "process_cpu": process_cpu}
        json.dump({**figures, "sum": tensor[0].item()}, report)
hvd.shutdown()
