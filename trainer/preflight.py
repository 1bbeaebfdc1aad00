"""Preflight: before training, measure allreduce bus bandwidth across all workers and stop with
a message naming the slowest node when it is below the floor for the VM size.

Bus bandwidth follows nccl-tests: algorithm bandwidth (bytes / time) times 2(n-1)/n, the
traffic each link carries in a ring allreduce, so the figure compares across worker counts.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import torch

from trainer.distributed import Dist

ITERATIONS = 5


class PreflightError(RuntimeError):
    """The fabric is too slow to train on; the message names the node."""


@dataclass(frozen=True)
class Bandwidth:
    busbw_gbps: float
    seconds_per_allreduce: float
    slowest_node: str
    slowest_rank: int


def node_name() -> str:
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()


def measure(dist: Dist, device: torch.device, megabytes: int) -> Bandwidth:
    """Time ``ITERATIONS`` allreduces of ``megabytes`` after one warm-up; every rank returns
    the same result (the slowest rank's time decides)."""
    tensor = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    dist.allreduce_sum(tensor)  # warm-up: connections and buffers
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(ITERATIONS):
        dist.allreduce_sum(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    mine = (time.perf_counter() - started) / ITERATIONS
    reports = dist.allgather_object((mine, node_name(), dist.rank))
    seconds, node, rank = max(reports)
    bus_bytes = tensor.numel() * 4 * 2 * (dist.size - 1) / dist.size
    return Bandwidth(bus_bytes / seconds / 1e9, seconds, node, rank)


def check(dist: Dist, device: torch.device, min_busbw_gbps: float) -> Bandwidth | None:
    """Measure and compare with the floor; raises ``PreflightError`` on every rank."""
    if dist.size < 2 or min_busbw_gbps <= 0:
        return None
    result = measure(dist, device, 256 if device.type == "cuda" else 16)
    if result.busbw_gbps < min_busbw_gbps:
        raise PreflightError(
            f"preflight: allreduce bus bandwidth {result.busbw_gbps:.2f} GB/s over "
            f"{dist.size} workers is below the {min_busbw_gbps:g} GB/s floor; slowest: node "
            f"{result.slowest_node} (rank {result.slowest_rank}, "
            f"{result.seconds_per_allreduce * 1e3:.1f} ms per allreduce): check its InfiniBand "
            f"links and GPUs, or replace the node"
        )
    return result
