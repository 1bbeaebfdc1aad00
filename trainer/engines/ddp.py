"""torch.distributed DDP (``--backend ddp``): the process group from the launcher's environment,
DistributedDataParallel's bucketed allreduce, and the collectives the trainer needs beside it."""

from __future__ import annotations

import importlib
import os
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
from torch import nn

from trainer.engines.base import Dist, GradientProbe
from trainer.settings.train_config import TrainConfig


class TorchDist(Dist):
    """torch.distributed with DDP; started by torchrun (or any launcher that sets RANK etc.)."""

    name = "ddp"

    def __init__(self) -> None:
        import torch.distributed as td

        missing = [
            k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
        ]
        if missing:
            raise RuntimeError(
                f"backend={self.name}: {', '.join(missing)} not set; start the trainer with "
                "torchrun"
            )
        # Before the group exists: torch.distributed.nn, which DDP imports, captures the default
        # group in its functions' default arguments (group=group.WORLD) at import. Imported
        # after init_process_group it would keep the group alive past destroy_process_group, its
        # Gloo threads running until the interpreter's teardown destroys it, where a thread that
        # releases a Python object aborts the process ("terminate called without an active
        # exception": a finished run exiting 1 now and then).
        importlib.import_module("torch.distributed.nn")

        self._td = td
        self._cuda = torch.cuda.is_available()
        if self._cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        td.init_process_group(backend="nccl" if self._cuda else "gloo")
        self.rank, self.size = td.get_rank(), td.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.size)))
        self._ddp_modules: list[weakref.ref[nn.Module]] = []  # released at shutdown

    @property
    def gpu_collectives(self) -> bool:
        return self._cuda

    def _device(self) -> torch.device:
        return (
            torch.device("cuda", torch.cuda.current_device()) if self._cuda else torch.device("cpu")
        )

    def wrap_model(
        self, model: nn.Module, cfg: TrainConfig, probe: GradientProbe | None = None
    ) -> nn.Module:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[self.local_rank] if self._cuda else None)
        self._ddp_modules.append(weakref.ref(ddp))
        reduce = default_hooks.fp16_compress_hook if cfg.fp16_allreduce else None
        if probe is not None:
            inner = reduce or default_hooks.allreduce_hook

            # No annotations: DDP checks a hook's annotations against its own types, and this
            # module's are strings (postponed evaluation).
            def measured(state, bucket):  # type: ignore[no-untyped-def]
                probe.local(bucket.buffer())  # this rank's gradients, before the allreduce
                return inner(state, bucket)

            reduce = measured
        if reduce is not None:
            ddp.register_comm_hook(None, reduce)
        return ddp

    def no_sync(self, model: nn.Module) -> ContextManager[Any]:
        return model.no_sync()  # type: ignore[operator]

    def broadcast_parameters(self, model: nn.Module) -> None:
        for tensor in model.state_dict().values():
            self._td.broadcast(tensor, src=0)

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj]
        self._td.broadcast_object_list(box, src=0)
        return box[0]

    def allgather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self._td.all_gather_object(out, obj)
        return out

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        result = tensor.clone()
        self._td.all_reduce(result, op=self._td.ReduceOp.SUM)
        return result

    def any_rank(self, flag: bool) -> bool:
        return bool(self.allreduce_sum(torch.tensor([int(flag)], device=self._device())).item() > 0)

    def any_rank_later(self, flag: bool) -> Callable[[], bool]:
        votes = torch.tensor([int(flag)], device=self._device())
        work = self._td.all_reduce(votes, op=self._td.ReduceOp.SUM, async_op=True)

        def result() -> bool:
            work.wait()
            return bool(votes.item() > 0)

        return result

    def barrier(self) -> None:
        self._td.barrier()

    def shutdown(self) -> None:
        # A DDP module holds the process group twice: as a Python object (``process_group``),
        # whose destructor lets go of the GIL, and through its C++ Reducer, whose binding does
        # not. If the Reducer drops the group's last reference, the Gloo destructor joins
        # worker threads while holding the GIL, and a worker waiting for the GIL to free a
        # finished allreduce's tensors never ends: a hang at exit, seen now and then. So both
        # references go here, while the group is still registered, and destroy_process_group
        # then ends the group's threads. A weak reference still reaches a module that is
        # garbage in a reference cycle not yet collected, so this covers modules still held (a
        # caller's variable, a traceback's frame) and those only the collector would free. No
        # gc.collect() here: collecting the run's DataLoader iterators together with their
        # queues loses the workers' stop message, and each worker then takes its 5 s timeout.
        for ref in self._ddp_modules:
            ddp = ref()
            if ddp is not None:
                for name in ("reducer", "logger", "process_group"):  # plain attributes
                    vars(ddp).pop(name, None)
        self._ddp_modules.clear()
        self._td.destroy_process_group()
