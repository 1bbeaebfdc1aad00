"""ResNet-50 synthetic images/sec on one GPU with AMP bf16 + channels_last, with and without
torch.compile, against NVIDIA's published PyTorch figure (A100, AMP: 2,470 img/s) and our
H100 target (3,000). On a machine without a GPU it says so and records nothing measured.

    .venv/bin/python -m bench.gpu [--steps 200] [--batch-size 256]
"""

from __future__ import annotations

import sys

import torch

from bench.common import run_trainer, save
from trainer.common.cli import OneLineParser

NVIDIA_A100_AMP = 2470
H100_TARGET = 3000


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu: no CUDA device on this machine; nothing measured")
        save("gpu", {"measured": False, "reason": "no CUDA device"})
        return
    flags = [
        "--backend",
        "local",
        "--device",
        "cuda",
        "--model",
        "resnet50",
        "--num-classes",
        "1000",
        "--image-size",
        "224",
        "--batch-size",
        str(args.batch_size),
        "--synthetic-size",
        str(args.batch_size * args.steps),
        "--max-steps",
        str(args.steps),
        "--amp",
        "bf16",
        "--channels-last",
        "on",
        "--warmup-epochs",
        "0",
        "--log-every",
        "20",
        "--checkpoint-every",
        "0",
    ]
    rows = {}
    for label, extra in (("bf16 + channels_last", []), ("+ torch.compile", ["--compile"])):
        rows[label] = run_trainer([sys.executable], [*flags, *extra])
        print(
            f"{label:<24}{rows[label]:>10.0f} img/s   "
            f"(A100 AMP {NVIDIA_A100_AMP}, H100 target {H100_TARGET})",
            flush=True,
        )
    save(
        "gpu",
        {
            "measured": True,
            "device": torch.cuda.get_device_name(0),
            "images_per_sec": rows,
            "reference_a100_amp": NVIDIA_A100_AMP,
            "target_h100": H100_TARGET,
        },
    )


if __name__ == "__main__":
    main()
