"""ImageNet augmentations with Pillow and torch (torchvision does not import on the pinned torch).

The same recipe as torchvision's reference scripts: RandomResizedCrop(scale 0.08-1, ratio 3/4-4/3)
+ horizontal flip + normalize for training, resize to size*256/224 + center crop for validation.
Randomness comes from an explicit generator so a sample's augmentation is a function of
(seed, epoch, index): identical across loader worker counts and across a resume.
"""

from __future__ import annotations

import math

import torch
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _uniform(generator: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * torch.rand((), generator=generator).item()


def random_resized_crop_box(
    width: int,
    height: int,
    generator: torch.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a random crop; falls back to a center crop after 10 tries."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * _uniform(generator, *scale)
        aspect = math.exp(_uniform(generator, *log_ratio))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            left = int(torch.randint(0, width - w + 1, (), generator=generator))
            top = int(torch.randint(0, height - h + 1, (), generator=generator))
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def to_normalized_tensor(image: Image.Image) -> torch.Tensor:
    data = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    tensor = data.view(image.height, image.width, 3).permute(2, 0, 1).float().div_(255.0)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return tensor.sub_(mean).div_(std)


def train_transform(image: Image.Image, size: int, generator: torch.Generator) -> torch.Tensor:
    box = random_resized_crop_box(image.width, image.height, generator)
    image = image.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if torch.rand((), generator=generator).item() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return to_normalized_tensor(image)


def eval_transform(image: Image.Image, size: int) -> torch.Tensor:
    resize_to = round(size * 256 / 224)
    scale = resize_to / min(image.width, image.height)
    width, height = max(size, round(image.width * scale)), max(size, round(image.height * scale))
    image = image.resize((width, height), Image.Resampling.BILINEAR)
    left, top = (width - size) // 2, (height - size) // 2
    return to_normalized_tensor(image.crop((left, top, left + size, top + size)))
