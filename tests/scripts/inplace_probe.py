"""Run under horovodrun (two workers) with tests/scripts/memcpy_count.c preloaded: a tensor of
MEMCPY_COUNT_BYTES bytes is reduced out of place, then in place; rank 0 writes to the file named
by its first argument the memcpy calls of the tensor's size each made (``copies``), and how many
of them copied a buffer onto itself (``self_copies``)."""

from __future__ import annotations

import ctypes
import json
import os
import sys

import horovod.torch as hvd
import torch

TENSOR_BYTES = int(os.environ["MEMCPY_COUNT_BYTES"])


def counts() -> tuple[int, int]:
    library = ctypes.CDLL(None)  # the preloaded library's symbols are the process's
    copies, self_copies = ctypes.c_ulong(), ctypes.c_ulong()
    library.memcpy_counts(ctypes.byref(copies), ctypes.byref(self_copies))
    return copies.value, self_copies.value


def measured(allreduce) -> dict:
    before = counts()
    allreduce()
    after = counts()
    return {"copies": after[0] - before[0], "self_copies": after[1] - before[1]}


hvd.init()
tensor = torch.ones(TENSOR_BYTES // 4)
report = {
    "out_of_place": measured(lambda: hvd.allreduce(tensor, op=hvd.Sum, name="out")),
    "in_place": measured(lambda: hvd.allreduce_(tensor, op=hvd.Sum, name="in")),
    "sum": tensor[0].item(),
}
if hvd.rank() == 0:
    with open(sys.argv[1], "w") as out:
        json.dump(report, out)
hvd.shutdown()
