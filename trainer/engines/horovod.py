"""Horovod, the default engine: allreduce of gradients (Horovod's fusion buffer and cycle
time; its compression hook also feeds the noise-scale probe) over NCCL on GPUs and Gloo on CPUs. The
only module that imports ``horovod.torch``."""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainer.engines.base import Dist, GradientProbe, clip_gradients
from trainer.settings.choices import (
    GLOO_CPU_CYCLE_MS,
    GLOO_CPU_FUSION_MB,
    NCCL_CYCLE_MS,
    NCCL_FUSION_MB,
)
from trainer.settings.train_config import TrainConfig


class _MeasuredCompression:
    """Horovod: its compression hook sees every local gradient just before the allreduce; this
    one shows it to the noise-scale probe, then compresses as configured."""

    def __init__(self, inner: Any, probe: GradientProbe) -> None:
        self.inner, self.probe = inner, probe

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        self.probe.local(tensor)
        return self.inner.compress(tensor)

    def decompress(self, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return self.inner.decompress(tensor, ctx)


class HorovodDist(Dist):
    name = "horovod"

    def __init__(self, cycle_time_ms: float = 0.0, fusion_mb: int | None = None) -> None:
        import horovod.torch as hvd

        nccl = torch.cuda.is_available() and bool(hvd.nccl_built())
        if not cycle_time_ms:  # the config's "0: chosen by the engine"
            cycle_time_ms = NCCL_CYCLE_MS if nccl else GLOO_CPU_CYCLE_MS
        if fusion_mb is None:  # the config's "chosen by the engine"
            fusion_mb = NCCL_FUSION_MB if nccl else GLOO_CPU_FUSION_MB
        # Read by hvd.init(), on every rank (Horovod's documented knobs; an operator's own
        # setting in the environment, or horovodrun's --cycle-time-ms, wins).
        os.environ.setdefault("HOROVOD_CYCLE_TIME", f"{cycle_time_ms:g}")
        os.environ.setdefault("HOROVOD_FUSION_THRESHOLD", str(fusion_mb * 1024 * 1024))
        hvd.init()
        self._hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self._object_ops = 0
        self._reduction_wait = 0.0  # seconds in synchronize(), for trainer.watch.stragglers

    def take_reduction_wait(self) -> float | None:
        # The host's wait in synchronize(): on a GPU it also holds this rank's own backward
        # kernels still running, which only makes a slow GPU look less slow, never a fast one slow.
        waited, self._reduction_wait = self._reduction_wait, 0.0
        return waited

    def _object_op_name(self) -> str:
        # Horovod matches collectives across ranks by name, and its object helpers default to
        # the object's type name: None on one rank and a dict on another would never match and
        # hang. Every rank makes the same calls in the same order, so a counter names them.
        self._object_ops += 1
        return f"trainer.object.{self._object_ops}"

    @property
    def gpu_collectives(self) -> bool:
        return torch.cuda.is_available() and bool(self._hvd.nccl_built())

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        cfg: TrainConfig,
        probe: GradientProbe | None = None,
    ) -> torch.optim.Optimizer:
        hvd = self._hvd
        # Horovod: compression halves the bytes on the wire; backward_passes_per_step
        # accumulates locally and reduces once per optimizer step.
        compression: Any = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
        if probe is not None:
            compression = _MeasuredCompression(compression, probe)
        return hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            op=hvd.Average,
            backward_passes_per_step=cfg.accumulation_steps,
        )

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        clip_norm: float,
        probe: GradientProbe | None = None,
    ) -> None:
        if not scaler.is_enabled() and not clip_norm and probe is None:
            started = time.perf_counter()
            optimizer.step()  # Horovod: synchronize() first, then the update (which is local)
            self._reduction_wait += time.perf_counter() - started
            return
        # Horovod: gradients must be reduced before the scaler unscales them, they are
        # measured or clipped, and step() must not reduce them a second time.
        started = time.perf_counter()
        optimizer.synchronize()  # type: ignore[attr-defined]
        self._reduction_wait += time.perf_counter() - started
        scaler.unscale_(optimizer)
        if probe is not None:
            probe.record_reduced(optimizer)
        if clip_norm:
            clip_gradients(optimizer, clip_norm)
        with optimizer.skip_synchronize():  # type: ignore[attr-defined]
            scaler.step(optimizer)
        scaler.update()

    def broadcast_parameters(self, model: nn.Module) -> None:
        self._hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def broadcast_object(self, obj: Any) -> Any:
        # Not hvd.broadcast_object: it turns the pickle into a tensor with
        # torch.ByteTensor(bytearray(...)), one Python element at a time, which took about 4
        # CPU-seconds on each rank for a ResNet-18 optimizer state at every resume (seen with a
        # sampling profiler). The same two broadcasts (size, bytes) over a zero-copy view.
        name = self._object_op_name()
        data = bytearray(
            pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if self.is_root else b""
        )
        size = torch.tensor([len(data)], dtype=torch.int64)
        self._hvd.broadcast_(size, root_rank=0, name=f"{name}.size")
        if not self.is_root:
            data = bytearray(int(size.item()))
        payload = torch.frombuffer(data, dtype=torch.uint8)  # a view: received into ``data``
        self._hvd.broadcast_(payload, root_rank=0, name=f"{name}.data")
        return obj if self.is_root else pickle.loads(data)

    def allgather_object(self, obj: Any) -> list[Any]:
        return self._hvd.allgather_object(obj, name=self._object_op_name())

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._hvd.allreduce(tensor, op=self._hvd.Sum)

    def any_rank(self, flag: bool) -> bool:
        total = self._hvd.allreduce(torch.tensor([int(flag)]), op=self._hvd.Sum)
        return bool(total.item() > 0)

    def any_rank_later(self, flag: bool) -> Callable[[], bool]:
        # A blocking allreduce waits for the background thread's next cycle (20 ms on CPUs):
        # started a step ahead, it rides in a cycle that carries the gradients anyway. One is
        # in flight at a time (the caller reads each before starting the next), so one name.
        handle = self._hvd.allreduce_async(
            torch.tensor([int(flag)]), op=self._hvd.Sum, name="trainer.any_rank_later"
        )
        return lambda: bool(self._hvd.synchronize(handle).item() > 0)

    def barrier(self) -> None:
        self._hvd.barrier()

    def shutdown(self) -> None:
        self._hvd.shutdown()
