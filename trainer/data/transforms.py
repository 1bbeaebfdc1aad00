"""ImageNet augmentations on uint8 tensors (torchvision does not import on the pinned torch).

The same recipe as torchvision's reference scripts: RandomResizedCrop(scale 0.08-1, ratio 3/4-4/3)
+ horizontal flip for training, resize to size*256/224 + center crop for validation, with
antialiased bilinear resizing. Samples stay uint8 until they reach the device, where
``normalize`` converts whole batches: a quarter of the bytes through the loader and the
host-to-device copy, and no per-image float arithmetic on the loader's cores.
Randomness comes from an explicit generator so a sample's augmentation is a function of
(seed, epoch, index): identical across loader worker counts and across a resume.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# RandomResizedCrop's range: the crop's share of the image's area, and its width/height.
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)


def _uniform(generator: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * torch.rand((), generator=generator).item()


# (left, top, right, bottom) in pixels.
Box = tuple[int, int, int, int]
# Picks a box from an image's (width, height): the crop is chosen before anything is decoded.
ChooseBox = Callable[[int, int], Box]


def random_resized_crop_box(
    width: int,
    height: int,
    generator: torch.Generator,
    scale: tuple[float, float] = CROP_SCALE,
    ratio: tuple[float, float] = CROP_RATIO,
) -> Box:
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


def lossless_short_side(size: int) -> int:
    """The smallest short side at which every training crop still covers ``size`` pixels on
    its short side, so that each ``size`` px crop is a downscale.

    The narrowest crop takes CROP_SCALE[0] of the area at the extreme ratio: its short side is
    sqrt(0.08 * 3/4) = 0.245 of the image's short side (less elongated images only widen it).
    An image stored with at least this short side gives the same crops as its original, up to
    resampling noise; a smaller one upsamples the small crops from fewer pixels.
    """
    narrowest = math.sqrt(CROP_SCALE[0] * min(CROP_RATIO[0], 1 / CROP_RATIO[1]))
    return math.ceil(size / narrowest)


def resize(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(h, w, 3) uint8 -> (3, height, width) uint8, antialiased bilinear (torch's uint8 path)."""
    batch = pixels.permute(2, 0, 1).unsqueeze(0).contiguous(memory_format=torch.channels_last)
    out = F.interpolate(batch, size=(height, width), mode="bilinear", antialias=True)
    return out[0]


def eval_resize(size: int) -> int:
    """The short side validation images are resized to before the center crop (256 for 224)."""
    return round(size * 256 / 224)


def short_side_shape(width: int, height: int, short: int) -> tuple[int, int]:
    """(height, width) with the short side scaled to ``short``, never below ``short``."""
    scale = short / min(width, height)
    return max(short, round(height * scale)), max(short, round(width * scale))


def crop_of(pixels: torch.Tensor, choose_box: ChooseBox) -> torch.Tensor:
    """The (h, w, 3) pixels of the box ``choose_box(width, height)`` picks (a view)."""
    height, width = pixels.shape[:2]
    left, top, right, bottom = choose_box(width, height)
    return pixels[top:bottom, left:right]


def augment_crop(crop: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """A training sample from the pixels of its RandomResizedCrop box (drawn from ``generator``
    just before): resized to ``size``, flipped half the time."""
    out = resize(crop, size, size)
    if torch.rand((), generator=generator).item() < 0.5:
        out = out.flip(-1)
    # Not made contiguous here: collating the batch copies every sample once anyway.
    return out


def eval_transform(pixels: torch.Tensor, size: int) -> torch.Tensor:
    height, width = pixels.shape[:2]
    new_height, new_width = short_side_shape(width, height, eval_resize(size))
    if (new_height, new_width) != (height, width):
        out = resize(pixels, new_height, new_width)
    else:
        out = pixels.permute(2, 0, 1)
    top, left = (new_height - size) // 2, (new_width - size) // 2
    return out[:, top : top + size, left : left + size]  # collating copies it


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> float normalized with the ImageNet mean and std, on their device."""
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=images.device).view(1, 3, 1, 1) * 255
    return (images.float() - mean) / std
