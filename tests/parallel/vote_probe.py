"""Run under horovodrun or torchrun: the ranks' stop vote (``trainer.signals.StopVote``) over
the engine, with other collectives in flight as a training step's would be.

Usage: vote_probe.py BACKEND REPORT_DIR. Rank 1 alone is asked to stop during step 2; each rank
writes vote-<rank>.json with what ``next()`` answered at each of 5 steps, the answer of a
``close()`` after them, and whether a separate ``any_rank_later`` read after other collectives
saw rank 1's True.
"""

import json
import sys
from pathlib import Path

import torch

from trainer.config import TrainConfig
from trainer.distributed import init_dist
from trainer.signals import StopRequest, StopVote

STEPS, SIGNALLED_DURING = 5, 2


def main() -> None:
    backend, report_dir = sys.argv[1], Path(sys.argv[2])
    dist = init_dist(TrainConfig(backend=backend, device="cpu"))
    stop = StopRequest()  # not installed: the "signal" is set by hand, on rank 1 only
    vote = StopVote(dist, stop)
    answers = []
    for step in range(1, STEPS + 1):
        # The step's own traffic (gradients, metrics) while the vote is in flight.
        summed = dist.allreduce_sum(torch.full((1000,), float(step)))
        assert summed[0].item() == step * dist.size
        dist.broadcast_object({"step": step})
        if dist.rank == 1 and step == SIGNALLED_DURING:
            stop.requested = True
        answers.append(vote.next())
    closed = vote.close()
    later = dist.any_rank_later(dist.rank == 1)
    dist.barrier()
    report = {"answers": answers, "closed": closed, "later": later()}
    dist.shutdown()
    (report_dir / f"vote-{dist.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
