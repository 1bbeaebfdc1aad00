"""ResNet v1.5 (18/34/50/101) and a tiny CNN for tests.

Written here rather than imported from torchvision, whose CPU wheels do not import against the
pinned torch. The layer layout and parameter counts match torchvision's: ResNet-50 with 1000
classes has 25,557,032 parameters. v1.5 puts the stride-2 in the bottleneck's 3x3 convolution
(not the first 1x1), as NVIDIA's and torchvision's implementations do; it is ~0.5% more accurate.
Imports torch only: no I/O and no distributed code.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import nn


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
