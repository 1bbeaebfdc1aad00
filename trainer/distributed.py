"""The one place that knows how workers talk to each other.

``Dist`` is the interface the trainer uses; ``HorovodDist`` (the default engine), ``TorchDist``
(torch.distributed DDP), ``FSDPDist`` (torch.distributed FSDP2: parameters, gradients and
optimizer state sharded over the ranks) and ``LocalDist`` (one process) implement it. This is
the only module that imports ``horovod.torch``, so the rest of the trainer runs wherever torch
does; the node launcher (``trainer.launch``) serves Horovod's rendezvous with ``horovod.runner``,
in-worker communication is all here.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any, NoReturn

import torch
from torch import nn

from trainer.background_save import cpu_copy
from trainer.common.errors import ConfigError
from trainer.settings.choices import (
    GLOO_CPU_CYCLE_MS,
    GLOO_CPU_FUSION_MB,
    NCCL_CYCLE_MS,
    NCCL_FUSION_MB,
)
from trainer.settings.train_config import TrainConfig


def clip_gradients(optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    """Scale every gradient the optimizer steps on so that their global L2 norm is at most
    ``max_norm``; returns the norm before clipping. With FSDP the gradients are DTensor shards
    and torch computes the norm over all of them (every rank gets the same value)."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm)


class GradientProbe:
    """For the gradient noise scale (``trainer.noise_scale``, ``--noise-scale-every``).

    Collects, on measuring steps, this rank's squared gradient norm before the reduction
    (``local``, called by the engine's hook for every gradient or bucket) and after it
    (``record_reduced``, called once the gradients are averaged, before clipping)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.active = False
        self.local_sq = torch.zeros((), dtype=torch.float64, device=device)
        self.reduced_sq = torch.zeros((), dtype=torch.float64, device=device)

    def start(self) -> None:
        self.active = True
        self.local_sq.zero_()
        self.reduced_sq.zero_()

    def local(self, gradients: torch.Tensor) -> None:
        if self.active:
            self.local_sq += gradients.detach().double().pow(2).sum().to(self.device)

    def record_reduced(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.active:
            return
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self.reduced_sq += param.grad.detach().double().pow(2).sum()
        self.active = False


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


class Dist(ABC):
    """How this worker talks to the others: the interface the trainer uses.

    The collectives are abstract, so a backend that forgets one fails when it is created
    instead of silently doing one process's maths. Every rank must make the same collective
    calls in the same order. The model and optimizer hooks default to one process's behaviour
    (nothing to wrap, nothing to reduce); backends override what their engine needs.
    """

    name: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    # False where the engine's threads may still run at the interpreter's teardown, which they
    # do not survive: the process then ends with exit_without_teardown once its work is done.
    teardown_safe = True

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    @abstractmethod
    def gpu_collectives(self) -> bool:
        """Whether gradients are reduced by NCCL (a plain sum, which LR scaling must count)."""

    # ---------------------------------------------------------------- model and optimizer
    def wrap_model(
        self, model: nn.Module, cfg: TrainConfig, probe: GradientProbe | None = None
    ) -> nn.Module:
        """The model as this engine trains it. ``probe`` (``--noise-scale-every``) is shown
        each local gradient before the engine reduces it, where the engine does that."""
        return model

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        cfg: TrainConfig,
        probe: GradientProbe | None = None,
    ) -> torch.optim.Optimizer:
        return optimizer

    def no_sync(self, model: nn.Module) -> ContextManager[Any]:
        """Context for a micro-batch whose gradients are accumulated, not yet reduced."""
        return contextlib.nullcontext()

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        clip_norm: float,
        probe: GradientProbe | None = None,
    ) -> None:
        """Step on the reduced gradients, clipped to ``clip_norm`` (0: not clipped) after the
        scaler unscaled them; on a measuring step ``probe`` records their norm first."""
        if clip_norm or probe is not None:
            scaler.unscale_(optimizer)  # a no-op when the scaler is disabled
        if probe is not None:
            probe.record_reduced(optimizer)
        if clip_norm:
            clip_gradients(optimizer, clip_norm)
        scaler.step(optimizer)
        scaler.update()

    def take_reduction_wait(self) -> float | None:
        """Seconds this rank waited for the other ranks' gradients since the last call, or
        None where the engine does not show it (DDP and FSDP wait inside backward).
        ``trainer.stragglers`` tells a slow rank from the ranks waiting for it by this."""
        return None

    @property
    def sharded_state(self) -> bool:
        """Whether each rank holds only its shard of the parameters and optimizer state (then
        every rank writes and reads its own part of a checkpoint: ``trainer.sharded_checkpoint``);
        otherwise rank 0 holds the whole state and writes it alone (``trainer.checkpoint``)."""
        return False

    def broadcast_training_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, resuming: bool
    ) -> None:
        """Make every rank start from rank 0's parameters, buffers and optimizer state."""
        self.broadcast_parameters(model)
        if resuming:
            # Pickled rather than hvd.broadcast_optimizer_state: that helper runs a dummy
            # optimizer step on ranks with empty state, which moves parameters under weight
            # decay, and it works per option tensor rather than on the whole state.
            # Copied to the CPU, so a receiving rank never materialises it on rank 0's GPU.
            state = cpu_copy(optimizer.state_dict()) if self.is_root else None
            state = self.broadcast_object(state)
            if not self.is_root:
                optimizer.load_state_dict(state)

    # ---------------------------------------------------------------- collectives
    @abstractmethod
    def broadcast_parameters(self, model: nn.Module) -> None:
        """Overwrite every rank's parameters and buffers with rank 0's."""

    @abstractmethod
    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled)."""

    @abstractmethod
    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""

    @abstractmethod
    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of ``tensor`` over all ranks (a new tensor)."""

    @abstractmethod
    def any_rank(self, flag: bool) -> bool:
        """True on every rank when any rank passes True (used to stop all ranks together)."""

    def any_rank_later(self, flag: bool) -> Callable[[], bool]:
        """``any_rank(flag)`` started now and read by calling what this returns, so that the
        ranks' exchange overlaps the caller's next work instead of stalling it. Every rank
        reads it before starting the next one. One process answers at once."""
        result = self.any_rank(flag)
        return lambda: result

    @abstractmethod
    def barrier(self) -> None:
        """Return when every rank has called it."""

    @abstractmethod
    def shutdown(self) -> None:
        """Leave the group; no collective may follow."""


class LocalDist(Dist):
    """One process, no communication: every collective is the identity."""

    name = "local"

    def __init__(self) -> None:
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.local_size = 1

    @property
    def gpu_collectives(self) -> bool:
        return False

    def broadcast_parameters(self, model: nn.Module) -> None:
        return None

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def any_rank(self, flag: bool) -> bool:
        return flag

    def barrier(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


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
        self._reduction_wait = 0.0  # seconds in synchronize(), for trainer.stragglers

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


class FSDPDist(TorchDist):
    """torch.distributed with FSDP2 (``fully_shard``, ZeRO-3): each rank keeps 1/N of every
    parameter, gradient and optimizer state; a block's full parameters exist only while it
    runs. Started like DDP (torchrun, or ``trainer.launch`` on Batch).

    The device mesh has one dimension ("shard") over every rank, or with ``shard_within=node``
    on more than one node two: ("replicate", "shard"), nodes by ranks within a node. Hybrid
    sharding gathers parameters over NVLink only; only the gradient reduction between replicas
    crosses InfiniBand. Ranks are numbered node by node (``trainer.launch``, torchrun), so the
    rows of the mesh are nodes.
    """

    name = "fsdp"
    # FSDP's process groups stay referenced after destroy_process_group (by the device mesh,
    # the background group and the sharded model the caller still holds), so their Gloo threads
    # end only when the interpreter's teardown destroys them, where one that releases a Python
    # object aborts the process ("terminate called without an active exception"): a finished
    # run exiting -6 now and then, seen in every run of a test module on an idle machine.
    teardown_safe = False

    def __init__(self, shard_within: str) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        super().__init__()
        nodes = self.size // self.local_size
        if shard_within == "node" and nodes > 1:
            if self.size % self.local_size:
                raise RuntimeError(
                    f"shard_within=node: {self.size} ranks do not split into nodes of "
                    f"{self.local_size}; use --shard-within world"
                )
            shape, names = (nodes, self.local_size), ("replicate", "shard")
        else:
            shape, names = (self.size,), ("shard",)
        self.mesh = init_device_mesh("cuda" if self._cuda else "cpu", shape, mesh_dim_names=names)
        # Created here, on every rank in the same order (creating a group is a collective).
        self._background_group = self._td.new_group(backend="gloo")

    @property
    def sharded_state(self) -> bool:
        return True

    @property
    def background_group(self) -> Any:
        """The process group background checkpoint writes talk over: Gloo (DCP's collectives
        carry small Python objects), and apart from training's, so a write's collectives never
        interleave with a step's (torch's advice for ``async_save``)."""
        return self._background_group

    def wrap_model(
        self, model: nn.Module, cfg: TrainConfig, probe: GradientProbe | None = None
    ) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from trainer.model import sharding_units

        # Every rank must shard the same starting point. The full model is still in host
        # memory here (the GPUs hold only shards once fully_shard has moved each block), so
        # instead of sending gigabytes from rank 0, every rank compares a digest of what it
        # built (the same seed gives the same weights) and a mismatch stops the run.
        self._check_same_start(model)
        policy = MixedPrecisionPolicy()
        if self._cuda and cfg.amp in ("auto", "bf16") and torch.cuda.is_bf16_supported():
            # bf16 compute and all-gathers, fp32 gradient reduction and master weights.
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for unit in sharding_units(model):
            fully_shard(unit, mesh=self.mesh, mp_policy=policy)
        fully_shard(model, mesh=self.mesh, mp_policy=policy)
        return model

    def _check_same_start(self, model: nn.Module) -> None:
        digest = [float(t.detach().double().sum()) for t in model.state_dict().values()]
        if len({tuple(d) for d in self.allgather_object(digest)}) != 1:
            raise ConfigError(
                "seed: the ranks built different initial weights; start every rank with the "
                "same settings"
            )

    def no_sync(self, model: nn.Module) -> ContextManager[Any]:
        @contextlib.contextmanager
        def accumulate() -> Any:
            model.set_requires_gradient_sync(False)  # type: ignore[operator]
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)  # type: ignore[operator]

        return accumulate()

    def broadcast_parameters(self, model: nn.Module) -> None:
        # The shards already came from rank 0's parameters (wrap_model); a resume loads each
        # rank's shards from the sharded checkpoint.
        return None


def init_dist(cfg: TrainConfig) -> Dist:
    """Start the configured backend (``trainer.settings.choices.BACKENDS``)."""
    backend = cfg.backend
    if backend == "horovod":
        return HorovodDist(cfg.horovod_cycle_time_ms, cfg.horovod_fusion_mb)
    if backend == "ddp":
        return TorchDist()
    if backend == "fsdp":
        return FSDPDist(cfg.shard_within)
    return LocalDist()


# What Gloo says when the other end of a collective went away (gloo/transport/tcp/pair.cc); it
# raises a plain RuntimeError, so the message is all there is to tell it from a bug.
_GLOO_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def is_peer_failure(err: BaseException) -> bool:
    """Whether ``err`` is what a worker sees when another worker died: Horovod shuts down its
    collectives; torch.distributed raises its DistError family, or Gloo's RuntimeError."""
    try:
        from horovod.common.exceptions import HorovodInternalError

        if isinstance(err, HorovodInternalError):
            return True
    except ImportError:
        pass
    import torch.distributed as td

    if isinstance(err, (td.DistBackendError, td.DistNetworkError, td.DistStoreError)):
        return True
    return isinstance(err, RuntimeError) and any(text in str(err) for text in _GLOO_PEER_GONE)


def exit_without_teardown(code: int) -> NoReturn:
    """End the process now with ``code``, its output flushed, without the interpreter's teardown
    (``Dist.teardown_safe``): call it once every file is closed and every worker stopped."""
    import logging
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
