"""``python -m trainer.launch.preflight_probe SPEC``: one process of the launcher's preflight, one
per worker slot of each node (its GPU; a CPU process on a CPU node). Every probe of the job
meets in a torch store on the master, times the allreduces of each group of the plan it belongs
to (NCCL on GPUs, Gloo on CPUs), round by round, and each node's first probe prints every
group's time (the slowest member's) as one ``@result`` line its launcher reads
(``trainer.launch.preflight``). A line ``@round K`` marks each round as it starts.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from typing import Any

RESULT = "@result "
ROUND = "@round "


def _device(spec: dict[str, Any]):
    import torch

    if spec["device"] != "cuda":
        return torch.device("cpu")
    visible = torch.cuda.device_count()
    if visible <= spec["local"]:
        raise RuntimeError(
            f"the VM size has {spec['slots']} GPUs, torch sees {visible} on this node: check its "
            "driver (nvidia-smi) and the container's GPUs"
        )
    torch.cuda.set_device(spec["local"])
    return torch.device("cuda", spec["local"])


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _barrier(store, key: str, world: int) -> None:
    """Every probe reached ``key`` (through the store: no process group spans the world)."""
    if store.add(key, 1) == world:
        store.set(f"{key}/all", "1")
    store.wait([f"{key}/all"])


def _time(group, tensor, iterations: int, device) -> float:
    """Seconds per allreduce of ``tensor`` in ``group`` after a warm-up (its connections)."""
    import torch.distributed as dist

    dist.all_reduce(tensor, group=group)
    _sync(device)
    started = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor, group=group)
    _sync(device)
    return (time.perf_counter() - started) / iterations


def measure(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Time this probe's groups; on each node's first probe, every group's slowest time (by its
    index in the plan) and every node's name (by its position)."""
    import torch
    import torch.distributed as dist

    device = _device(spec)
    rank, world, timeout = spec["rank"], spec["world"], timedelta(seconds=spec["timeout"])
    # torch.distributed.TCPStore is documented public API; its stub does not re-export it.
    store = dist.TCPStore(spec["master"], spec["port"], world, rank == 0, timeout=timeout)  # pyright: ignore[reportPrivateImportUsage]
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    plan = [[tuple(ranks) for ranks in groups] for groups in spec["rounds"]]
    flat = [ranks for groups in plan for ranks in groups]
    # Every probe creates every group, in the plan's order (torch's rule for new_group); only
    # the members' connect. The groups this probe is in, by their index in the plan:
    groups = [dist.new_group(sorted(ranks)) for ranks in flat]
    mine = {i: group for i, group in enumerate(groups) if rank in flat[i]}
    tensor = torch.ones(int(spec["megabytes"] * 2**20) // 4, dtype=torch.float32, device=device)
    times: dict[int, float] = {}
    index = 0
    for number, groups in enumerate(plan):
        print(f"{ROUND}{number}", flush=True)
        _barrier(store, f"round-{number}", world)
        for _ in groups:
            if index in mine:
                times[index] = _time(mine[index], tensor, spec["iterations"], device)
            index += 1
    store.set(f"times/{rank}", json.dumps(times))
    if spec["local"] == 0:
        store.set(f"name/{spec['position']}", json.dumps([spec["host"], spec["node_id"]]))
    _barrier(store, "measured", world)
    result = _gather(store, spec) if spec["local"] == 0 else None
    _barrier(store, "read", world)
    dist.destroy_process_group()
    _leave(store, rank, world, time.monotonic() + spec["timeout"])
    return result


def _gather(store, spec: dict[str, Any]) -> dict[str, Any]:
    """Every group's slowest member's time, and every node's name, from the store."""
    slowest: dict[str, float] = {}
    for other in range(spec["world"]):
        for key, seconds in json.loads(store.get(f"times/{other}")).items():
            slowest[key] = max(slowest.get(key, 0.0), seconds)
    names = [json.loads(store.get(f"name/{node}")) for node in range(spec["nodes"])]
    return {"seconds": slowest, "names": names}


def _leave(store, rank: int, world: int, deadline: float) -> None:
    """The master's first probe serves the store: it leaves once every other probe has."""
    if rank != 0:
        store.add("left", 1)
        return
    while store.add("left", 0) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    try:
        result = measure(spec)
    except Exception as err:  # one line for the launcher, which names the node
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"{type(err).__name__}: {first}", flush=True)
        return 1
    if result is not None:
        print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
