"""The trainer's own preflight (``--preflight-min-busbw``): before training, one allreduce of the
whole job's workers, timed, and a stop when its bus bandwidth is below the floor. It measures the
world's ring as training uses it; it cannot tell which node is slow (every rank of a collective
waits for the slowest). The launcher's preflight names that node: it times each node's own GPUs
and the nodes in pairs before any worker starts (``trainer.launch.preflight``).

Bus bandwidth follows nccl-tests: algorithm bandwidth (bytes / time) times 2(n-1)/n, the
traffic each link carries in a ring allreduce, so the figure compares across worker counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from trainer.engines.base import Dist

ITERATIONS = 5


class PreflightError(RuntimeError):
    """The fabric is too slow to train on; the message says where to look."""


@dataclass(frozen=True)
class Bandwidth:
    busbw_gbps: float
    seconds_per_allreduce: float


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
    seconds = max(dist.allgather_object(mine))
    bus_bytes = tensor.numel() * 4 * 2 * (dist.size - 1) / dist.size
    return Bandwidth(bus_bytes / seconds / 1e9, seconds)


def check(dist: Dist, device: torch.device, min_busbw_gbps: float) -> Bandwidth | None:
    """Measure and compare with the floor; raises ``PreflightError`` on every rank."""
    if dist.size < 2 or min_busbw_gbps <= 0:
        return None
    result = measure(dist, device, 256 if device.type == "cuda" else 16)
    if result.busbw_gbps < min_busbw_gbps:
        raise PreflightError(
            f"preflight: allreduce bus bandwidth {result.busbw_gbps:.2f} GB/s over "
            f"{dist.size} workers is below the {min_busbw_gbps:g} GB/s floor "
            f"({result.seconds_per_allreduce * 1e3:.1f} ms per allreduce): a collective cannot "
            "tell which node held it up; the launcher's preflight (on GPU sizes, or "
            "--preflight on) times each node and each pair of nodes and names a slow one "
            "(docs/jobs.md, A node that fails)"
        )
    return result
