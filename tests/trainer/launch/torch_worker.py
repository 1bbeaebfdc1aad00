"""``python -m trainer`` as a launcher's worker, recording what it was started with: the
torch.distributed variables the launcher gave it and the rank and world size torch.distributed
reported once the group formed, as ``$WORKER_RECORD/worker-<RANK>.json``. Everything else is
the trainer's own ``__main__`` with the same arguments (the launcher reads ``--backend`` from
them as from the job's command)."""

import json
import os
import runpy
import sys
from pathlib import Path

import trainer.engines.choose

VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "HOROVOD_RANK",
)  # fmt: skip
started_by_torchrun_variables = trainer.engines.choose.init_dist


def recording_init_dist(cfg):
    dist = started_by_torchrun_variables(cfg)
    record = {
        "env": {key: os.environ.get(key) for key in VARIABLES},
        "rank": dist.rank,
        "size": dist.size,
        "local_rank": dist.local_rank,
    }
    path = Path(os.environ["WORKER_RECORD"]) / f"worker-{os.environ['RANK']}.json"
    path.write_text(json.dumps(record))
    return dist


# trainer.__main__ imports init_dist when it starts the engine, so it gets this one.
trainer.engines.choose.init_dist = recording_init_dist
sys.argv[0] = "trainer"
runpy.run_module("trainer", run_name="__main__", alter_sys=True)
