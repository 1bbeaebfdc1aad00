"""The model a run trains, built by its name (the ResNets and the tiny CNN of ``resnet``, the GPT
decoders of ``gpt``), and which of its blocks FSDP shards and activation checkpointing wraps.
Imports torch only: no I/O and no distributed code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from trainer.models.gpt import build_gpt
from trainer.models.gpt_sizes import GPT_SIZES
from trainer.models.resnet import BasicBlock, Bottleneck, ResNet, TinyCNN

_BUILDERS: dict[str, Callable[[int], nn.Module]] = {
    "resnet18": lambda n: ResNet(BasicBlock, [2, 2, 2, 2], n),
    "resnet34": lambda n: ResNet(BasicBlock, [3, 4, 6, 3], n),
    "resnet50": lambda n: ResNet(Bottleneck, [3, 4, 6, 3], n),
    "resnet101": lambda n: ResNet(Bottleneck, [3, 4, 23, 3], n),
    "tiny": TinyCNN,
}


def build_model(name: str, outputs: int, device: torch.device | str | None = None) -> nn.Module:
    """Build a model by name (one of ``trainer.settings.choices.MODELS``) with ``outputs`` classes,
    or for a language model a vocabulary of ``outputs`` tokens. ``device="meta"`` allocates
    nothing (to count a large model's parameters)."""
    if name in GPT_SIZES:
        return build_gpt(name, outputs, device=device)
    with torch.device(device or "cpu"):
        return _BUILDERS[name](outputs)


def sharding_units(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one by one (each gathers its parameters just before it runs and
    frees them after, so peak memory holds one block's full parameters, not the model's) and
    activation checkpointing recomputes. A model names them itself in a ``sharding_units``
    attribute (a list of its submodules, or a method returning one: a plug-in's way,
    trainer.training.plugins); otherwise a GPT's transformer blocks (``model.blocks``), ResNet's
    residual blocks, or else the entries of the model's outermost ``nn.ModuleList``s (where
    transformer code keeps its layers). The tiny test CNN has none; the root then holds
    everything."""
    declared = getattr(model, "sharding_units", None)
    if declared is not None:
        return list(declared() if callable(declared) else declared)
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        return list(blocks)
    residual = [m for m in model.modules() if isinstance(m, (BasicBlock, Bottleneck))]
    return residual or _outermost_list_entries(model)


def _outermost_list_entries(model: nn.Module) -> list[nn.Module]:
    units: list[nn.Module] = []
    inside: set[int] = set()  # modules already within a collected list
    for module in model.modules():  # parents before children
        if isinstance(module, nn.ModuleList) and id(module) not in inside:
            units += list(module)
            inside |= {id(m) for m in module.modules()}
    return units


def checkpoint_activations(units: list[nn.Module]) -> None:
    """Recompute each unit's activations in the backward pass instead of keeping them: memory
    for one unit's activations at a time, for about one more forward pass of compute. The
    forward is replaced on the instance, so parameter names (and checkpoints) do not change."""
    for unit in units:
        forward = unit.forward

        def recomputed(*args: Any, _forward: Callable[..., Any] = forward) -> Any:
            return torch.utils.checkpoint.checkpoint(_forward, *args, use_reentrant=False)

        unit.forward = recomputed  # type: ignore[method-assign]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
