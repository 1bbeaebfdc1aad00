"""ResNet v1.5 (18/34/50/101), a tiny CNN for tests, and the GPT decoders of ``trainer.lm``.

Written here rather than imported from torchvision, whose CPU wheels do not import against the
pinned torch. The layer layout and parameter counts match torchvision's: ResNet-50 with 1000
classes has 25,557,032 parameters. v1.5 puts the stride-2 in the bottleneck's 3x3 convolution
(not the first 1x1), as NVIDIA's and torchvision's implementations do; it is ~0.5% more accurate.
Imports torch only: no I/O and no distributed code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from trainer.lm.model import build_gpt
from trainer.lm.sizes import GPT_SIZES


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)


def _conv1x1(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int, downsample: nn.Module | None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_ch, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int, downsample: nn.Module | None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(in_ch, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)  # v1.5: the stride lives here
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3


Block = type[BasicBlock] | type[Bottleneck]


class ResNet(nn.Module):
    def __init__(self, block: Block, layers: list[int], num_classes: int) -> None:
        super().__init__()
        self.in_ch = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(block, 64, layers[0], stride=1)
        self.layer2 = self._stage(block, 128, layers[1], stride=2)
        self.layer3 = self._stage(block, 256, layers[2], stride=2)
        self.layer4 = self._stage(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        self._init_weights()

    def _stage(self, block: Block, width: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.in_ch != width * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.in_ch, width * block.expansion, stride),
                nn.BatchNorm2d(width * block.expansion),
            )
        stage = [block(self.in_ch, width, stride, downsample)]
        self.in_ch = width * block.expansion
        stage += [block(self.in_ch, width, 1, None) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        # Zero-init the last BN of each residual branch so every block starts as the identity:
        # Goyal et al. 2017, section 5.1; it makes large-batch warmup train stably.
        for m in self.modules():
            if isinstance(m, (BasicBlock, Bottleneck)):
                nn.init.zeros_(m.last_bn().weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class TinyCNN(nn.Module):
    """Two convolutions and a classifier: fast enough for multi-process tests on two CPU cores."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


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
    trainer.plugins); otherwise a GPT's transformer blocks (``model.blocks``), ResNet's residual
    blocks, or else the entries of the model's outermost ``nn.ModuleList``s (where transformer
    code keeps its layers). The tiny test CNN has none; the root then holds everything."""
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
