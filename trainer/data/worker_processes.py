"""The process start method of every data worker: DataLoader workers and ``prepare``'s pool.

Workers start from a forkserver, a clean single-threaded server process (InfiniBand verbs, CUDA
and the Gloo/NCCL threads of the training process are not fork-safe). A plain forkserver
imports nothing, so every worker forked from it imports torch, PIL and this package itself
(about 2.5 CPU-seconds and a few hundred MB each, seen with a sampling profiler as
``multiprocessing.spawn.prepare`` in every worker). Preloaded, the server imports them once and
each worker starts as a copy of it: 8 ranks with 8 loader workers each pay 8 imports, not 64,
and the workers share the imported pages.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import ForkServerContext

# What the workers run: the datasets and sources of trainer.data (their imports bring torch,
# PIL and numpy) and prepare's inspection and shard writers.
PRELOAD = ["trainer.data.loaders", "trainer.data.prepare"]


def forkserver() -> ForkServerContext:
    """The forkserver context, with the modules every data worker needs preloaded (the list
    counts only before this process's server starts: the first loader or pool starts it)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context
