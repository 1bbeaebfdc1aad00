"""The GPU path (CUDA, bf16 autocast, channels_last). Skipped without a CUDA device unless
TRAINER_TEST_GPU=1, which turns a missing GPU into a failure (Horovod's skip_or_fail_gpu_test)."""

import os

import pytest
import torch

from tests.conftest import tiny_config
from trainer.engines.device import resolve_precision
from trainer.engines.local import LocalDist
from trainer.settings.train_config import DEFAULTS
from trainer.training.run import train


def require_gpu():
    if torch.cuda.is_available():
        return
    if os.environ.get("TRAINER_TEST_GPU") == "1":
        pytest.fail("TRAINER_TEST_GPU=1 but no CUDA device is visible")
    pytest.skip("no CUDA device (TRAINER_TEST_GPU=1 makes this a failure)")


def test_cpu_defaults_to_fp32_and_contiguous_layout():
    assert resolve_precision(DEFAULTS, torch.device("cpu")) == (None, False)
    assert resolve_precision(
        DEFAULTS.replace(amp="bf16", channels_last="on"), torch.device("cpu")
    ) == (torch.bfloat16, True)


def test_gpu_trains_with_bf16_and_channels_last(tmp_path):
    require_gpu()
    assert resolve_precision(DEFAULTS, torch.device("cuda")) == (torch.bfloat16, True)
    cfg = DEFAULTS.replace(
        **tiny_config(tmp_path, model="resnet18", image_size=64, max_steps=3, backend="local")
    )
    result = train(cfg, LocalDist())
    assert result.step == 3
    assert next(result.model.parameters()).is_cuda
    assert result.last_metrics["loss"] > 0
