"""A plain torchrun DDP script, as a job's own command runs it (docs/jobs.md, Your own script).

On a laptop CPU, two workers:
    torchrun --standalone --nproc_per_node 2 examples/torchrun_ddp/train.py --steps 40
As a job: jobs.<name>.command: python train.py --steps 4000 (with jobs.<name>.code: examples/
torchrun_ddp). It uses only what torchrun or the node launcher sets (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and DT_RUN_DIR, the run folder on the shared file system:
checkpoints in $DT_RUN_DIR/checkpoints (resumed on a rerun or a retried task), TensorBoard in
$DT_RUN_DIR/tensorboard and training records in $DT_RUN_DIR/metrics.jsonl (the launcher uploads
both for dt-jobs metrics|tensorboard). SIGTERM (an eviction, a terminate): every rank stops at
the same step, rank 0 checkpoints, and the script exits 0. A checkpoint folder that holds
anything but this script's own checkpoints (the trainer's, after `make demo` in the same run
folder) is refused in one line, exit 2, before any rank trains.
"""

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter

stop_requested = False
# What this script writes, and only that: the trainer's checkpoints (step-<9 digits>.pt,
# step-<9 digits>.dcp) hold another model and must never be loaded into this one.
OWN_NAME = re.compile(r"step-\d{8}\.pt")
WRITER = "examples/torchrun_ddp"


def request_stop(signum, frame):
    global stop_requested
    stop_requested = True


def save(model, optimizer, step, folder):
    """Atomically: a half-written file never looks like a checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {"writer": WRITER, "step": step, "model": model.state_dict()}
    state["optimizer"] = optimizer.state_dict()
    partial = folder / f".step-{step:08d}.pt.partial"
    torch.save(state, partial)
    os.replace(partial, folder / f"step-{step:08d}.pt")


def newest(folder):
    """The newest of this script's checkpoints in ``folder``, or None; exits 2, in one line
    from rank 0, when the folder holds a checkpoint this script did not write."""
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    foreign = [e for e in entries if e.name.startswith("step-") and not OWN_NAME.fullmatch(e.name)]
    saved = [e for e in entries if OWN_NAME.fullmatch(e.name)]
    state = torch.load(saved[-1], weights_only=True) if saved else None
    if state is not None and state.get("writer") != WRITER:
        foreign.append(saved[-1])
    if foreign:
        if os.environ.get("RANK", "0") == "0":
            print(
                f"{foreign[0]} is not a checkpoint of {WRITER} (the trainer's, or another "
                f"script's): set DT_RUN_DIR to a run folder of this script's own",
                file=sys.stderr,
            )
        sys.exit(2)
    return state


def batch(step, rank, size):
    """Synthetic data: y = 3x - 1 plus noise, a different slice for each rank and step."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(size, 16, generator=generator)
    return x, 3 * x.sum(dim=1, keepdim=True) - 1 + 0.01 * torch.randn(size, 1, generator=generator)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (demos)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, request_stop)
    run_dir = Path(os.environ.get("DT_RUN_DIR", "runs/torchrun_ddp"))
    checkpoints = run_dir / "checkpoints"
    state = newest(checkpoints)  # every rank reads the same file, before any of them trains
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")

    torch.manual_seed(0)  # every rank starts from the same weights
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    writer = SummaryWriter(run_dir / "tensorboard") if rank == 0 else None
    if rank == 0:
        print(f"training steps {start + 1}..{args.steps} on {dist.get_world_size()} workers")

    step, loss = start, None
    while step < args.steps:
        # Every rank learns of a signal at the same step (one of them may get it later).
        stop = torch.tensor([float(stop_requested)], device=device)
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
        x, y = batch(step, rank, args.batch_size)
        loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        time.sleep(args.step_seconds)
        if rank == 0:
            writer.add_scalar("train/loss", loss.item(), step)
            with open(run_dir / "metrics.jsonl", "a") as log:
                log.write(json.dumps({"kind": "train", "step": step, "loss": loss.item()}) + "\n")
            if step % args.checkpoint_every == 0 or step == args.steps:
                save(model, optimizer, step, checkpoints)
    if rank == 0:
        if step < args.steps:
            save(model, optimizer, step, checkpoints)
            print(f"stopped by a signal at step {step}: checkpointed")
        else:
            print(f"done at step {step}" + (f", loss {loss.item():.4f}" if loss else ""))
        writer.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
