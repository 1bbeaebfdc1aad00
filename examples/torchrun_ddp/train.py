"""A plain torchrun DDP script, as a job's own command runs it (docs/jobs.md, Your own script).

On a laptop CPU, two workers:
    torchrun --standalone --nproc_per_node 2 examples/torchrun_ddp/train.py --steps 40
As a job: jobs.<name>.command: python train.py --steps 4000 (with jobs.<name>.code: examples/
torchrun_ddp). It uses only what torchrun or the node launcher sets (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and DT_RUN_DIR, the run folder on the shared file system:
checkpoints in $DT_RUN_DIR/checkpoints (resumed on a rerun or a retried task), TensorBoard in
$DT_RUN_DIR/tensorboard and training records in $DT_RUN_DIR/metrics.jsonl (the launcher uploads
both for dt-jobs metrics|tensorboard). SIGTERM (an eviction, a terminate): every rank stops at
the same step, rank 0 checkpoints, and the script exits 0.
"""

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter

stop_requested = False


def request_stop(signum, frame):
    global stop_requested
    stop_requested = True


def save(model, optimizer, step, folder):
    """Atomically: a half-written file never looks like a checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    partial = folder / f".step-{step:08d}.pt.partial"
    torch.save(state, partial)
    os.replace(partial, folder / f"step-{step:08d}.pt")


def newest(folder):
    saved = sorted(folder.glob("step-*.pt")) if folder.is_dir() else []
    return torch.load(saved[-1], weights_only=True) if saved else None


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
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    run_dir = Path(os.environ.get("DT_RUN_DIR", "runs/torchrun_ddp"))
    checkpoints = run_dir / "checkpoints"

    torch.manual_seed(0)  # every rank starts from the same weights
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 0
    if (state := newest(checkpoints)) is not None:  # every rank reads the same file
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
