"""Checkpoint save and load time and size for ResNet-50 with its SGD momentum (what the trainer
writes: atomic write, fsync, SHA-256 sidecar; load verifies the checksum, weights_only). A
benchmark: prints and saves, asserts nothing.

    .venv/bin/python -m bench.checkpoint_io [--repeat 3]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import save
from trainer.checkpoints import single_file
from trainer.common.cli import OneLineParser
from trainer.models.build import build_model


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    model = build_model("resnet50", 1000)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    optimizer.step()  # creates the momentum buffers a real checkpoint carries
    state = {"step": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    saves, loads, size = [], [], 0
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        for step in range(1, args.repeat + 1):
            started = time.perf_counter()
            path = single_file.save(folder, step, state, keep=1)
            saves.append(time.perf_counter() - started)
            size = path.stat().st_size
            started = time.perf_counter()
            single_file.load(path)
            loads.append(time.perf_counter() - started)
    results = {
        "size_mb": size / 2**20,
        "save_s": statistics.median(saves),
        "load_s": statistics.median(loads),
        "repeat": args.repeat,
    }
    print(
        f"ResNet-50 + SGD momentum: {results['size_mb']:.1f} MB, save {results['save_s']:.2f} s "
        f"(write, fsync, checksum), load {results['load_s']:.2f} s (checksum, weights_only)"
    )
    save("checkpoint_io", results)


if __name__ == "__main__":
    main()
