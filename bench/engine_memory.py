"""Peak memory per rank of the same language model trained by DDP, FSDP and hybrid FSDP on 2
ranks, set against the model state each layout is expected to hold per rank (a benchmark:
prints and saves, asserts nothing).

    .venv/bin/python -m bench.engine_memory [--steps 3]

GPT-2 small (124M parameters with the 50,257-token vocabulary) with AdamW, 64 random tokens per
sample, batch 1: activations are a few MB, so the model state dominates. Model state in fp32 is
16 bytes per parameter (weights, gradients and AdamW's two moments), divided by the number of
ranks that shard it. Measured: each rank's largest resident set on this CPU from its second
step to its final save, sampled from /proc (the mean over ranks), and the trainer's
``peak_memory_gb`` (the high-water mark since start). Both hold torch's own libraries (about
half a GB), and DDP holds its gradient buckets (4 more bytes per parameter).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, free_port, read_records, save, torchrun
from trainer.common.cli import OneLineParser
from trainer.models.gpt_sizes import GPT_SIZES, parameter_count

MODEL, VOCAB, CONTEXT = "gpt-small", 50257, 64
WORKERS = 2
STATE_BYTES_PER_PARAM = 16  # fp32 weights + gradients + AdamW exp_avg + exp_avg_sq

# name -> (engine flags, ranks per "node" on this machine, ranks sharing one copy of the state)
LAYOUTS = {
    "ddp": (["--backend", "ddp"], WORKERS, 1),
    "fsdp": (["--backend", "fsdp", "--shard-within", "world"], WORKERS, WORKERS),
    # 2 "nodes" of 1 rank: a 2-D mesh replicate 2 x shard 1. On one node of 2 ranks hybrid
    # would be plain FSDP; across nodes of 1 rank it replicates everything (DDP's memory). The
    # case it is for is nodes of 8 GPUs: shard over the 8 on NVLink, replicate across nodes.
    "hybrid": (["--backend", "fsdp", "--shard-within", "node"], 1, 1),
}


def state_bytes_per_rank(parameters: int, shard_group: int) -> float:
    """Expected model-state bytes on one rank: fp32 weights, gradients and AdamW's two moments
    (16 bytes per parameter), split over the ``shard_group`` ranks that shard them."""
    if shard_group < 1:
        raise ValueError(f"shard_group={shard_group}: must be at least 1")
    return STATE_BYTES_PER_PARAM * parameters / shard_group


def peak_memory_gb(records: list[dict]) -> float:
    """The run's peak memory per rank: the largest of its "train" records' means over ranks."""
    return max(r["peak_memory_gb"] for r in records if r.get("kind") == "train")


def children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (name) state ppid ...": the name may hold spaces, so split after ")".
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def rss_bytes(pid: int) -> int:
    """The resident set of ``pid`` now (0 once it has exited)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def training_window(metrics: Path) -> bool:
    """True from the first "train" record (the optimizer's state exists) until the first
    "checkpoint" record (the run's final save)."""
    kinds = []
    with contextlib.suppress(OSError):
        for line in metrics.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line being written
                kinds.append(json.loads(line).get("kind"))
    return "train" in kinds and "checkpoint" not in kinds


def run_watched(name: str, steps: int) -> tuple[list[dict], float]:
    """One run of ``name``: its metrics records and each rank's largest resident set while it
    trains after its first step (the mean over ranks, GB), sampled from /proc every 50 ms."""
    engine, local_size, _ = LAYOUTS[name]
    flags = [
        "--model", MODEL, "--vocab-size", str(VOCAB), "--context", str(CONTEXT),
        "--data", "synthetic", "--synthetic-size", "64", "--batch-size", "1",
        "--optimizer", "adamw", "--lr", "3e-4", "--warmup-epochs", "0", "--loader-workers", "0",
        "--max-steps", str(steps), "--log-every", "1", "--checkpoint-every", "0",
        "--keep-checkpoints", "1", *engine,
    ]  # fmt: skip
    # glibc keeps freed blocks below its (adaptive, up to 32 MB) mmap threshold for reuse, so a
    # rank's resident set would stay at its high-water mark; a fixed 128 KB threshold maps every
    # tensor on its own and returns it on free: the resident set then follows live tensors.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    port = str(free_port())
    with tempfile.TemporaryDirectory() as temp:
        out = Path(temp)
        command = [sys.executable, "-m", "trainer", *flags, "--output-dir", temp]
        if local_size == WORKERS:  # torchrun: the ranks are its children
            commands = [([*torchrun(WORKERS), *command[1:]], env)]
        else:  # 2 "nodes" of 1 rank, started as trainer.launch starts them
            commands = [
                (
                    command,
                    {
                        **env, "RANK": str(rank), "WORLD_SIZE": str(WORKERS),
                        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                    },
                )
                for rank in range(WORKERS)
            ]  # fmt: skip
        peaks: dict[int, int] = {}
        with open(out / "launcher.log", "w") as log:
            processes = [
                subprocess.Popen(c, cwd=REPO, env=e, stdout=log, stderr=subprocess.STDOUT)
                for c, e in commands
            ]
            try:
                while any(p.poll() is None for p in processes):
                    if training_window(out / "metrics.jsonl"):
                        ranks = [p.pid for p in processes]
                        if local_size == WORKERS:
                            ranks = children(processes[0].pid)
                        for pid in ranks:
                            peaks[pid] = max(peaks.get(pid, 0), rss_bytes(pid))
                    time.sleep(0.05)
            finally:
                for process in processes:
                    if process.poll() is None:
                        process.kill()
        if any(p.returncode for p in processes) or not peaks:
            raise RuntimeError(f"{name} failed:\n{(out / 'launcher.log').read_text()[-3000:]}")
        records = read_records(out / "metrics.jsonl")
    return records, sum(peaks.values()) / len(peaks) / 1e9


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    parameters = parameter_count(GPT_SIZES[MODEL], VOCAB)
    print(
        f"{MODEL}, {parameters:,} parameters, AdamW, {CONTEXT} tokens x batch 1, {args.steps} "
        f"steps, {WORKERS} ranks, Gloo on 127.0.0.1"
    )
    print(
        f"{'layout':<8}{'shard group':>12}{'state GB':>10}{'RSS training GB':>17}"
        f"{'peak RSS GB':>13}"
    )
    rows = {}
    for name, (_, local_size, shard) in LAYOUTS.items():
        expected = state_bytes_per_rank(parameters, shard) / 1e9
        records, training = run_watched(name, args.steps)
        peak = peak_memory_gb(records)
        rows[name] = {
            "ranks_per_node": local_size,
            "shard_group": shard,
            "expected_state_gb_per_rank": expected,
            "rss_training_gb_per_rank": training,
            "peak_memory_gb_per_rank": peak,
        }
        print(f"{name:<8}{shard:>12}{expected:>10.2f}{training:>17.2f}{peak:>13.2f}", flush=True)
    ratios = {
        name: {
            "expected": rows[name]["expected_state_gb_per_rank"]
            / rows["ddp"]["expected_state_gb_per_rank"],
            "rss_training": rows[name]["rss_training_gb_per_rank"]
            / rows["ddp"]["rss_training_gb_per_rank"],
            "peak": rows[name]["peak_memory_gb_per_rank"] / rows["ddp"]["peak_memory_gb_per_rank"],
        }
        for name in ("fsdp", "hybrid")
    }
    for name, ratio in ratios.items():
        print(
            f"{name}/ddp: RSS while training {ratio['rss_training']:.2f}, peak RSS "
            f"{ratio['peak']:.2f}, model state alone {ratio['expected']:.2f}"
        )
    print(
        "hybrid here: 2 nodes of 1 rank (LOCAL_WORLD_SIZE=1), so replicate 2 x shard 1, DDP's "
        "memory; on one node of 2 it is plain FSDP. It is meant for nodes of 8 GPUs: state / 8 "
        "per GPU, gradients reduced across nodes only once per step."
    )
    print(
        "RSS training: each rank's largest resident set from its second step to its final save "
        "(the mean over ranks). Peak RSS (the trainer's peak_memory_gb) is the high-water mark "
        "since start: it includes building the whole model on every rank before FSDP shards it. "
        "Both hold torch's libraries (~0.5 GB); DDP also holds its gradient buckets "
        "(4 bytes/parameter)."
    )
    path = save(
        "engine_memory",
        {
            "model": MODEL,
            "parameters": parameters,
            "vocab_size": VOCAB,
            "context": CONTEXT,
            "workers": WORKERS,
            "steps": args.steps,
            "results": rows,
            "ratios_vs_ddp": ratios,
        },
    )
    print(f"saved {path.relative_to(path.parents[2])}")


if __name__ == "__main__":
    main()
