"""torch.distributed FSDP2 (``--backend fsdp``): parameters, gradients and optimizer state
sharded over the ranks (or a node's ranks, ``--shard-group node``), unit by unit."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
from torch import nn

from trainer.common.errors import ConfigError
from trainer.engines.base import GradientProbe
from trainer.engines.ddp import TorchDist
from trainer.settings.train_config import TrainConfig


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

        from trainer.models.build import sharding_units

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
