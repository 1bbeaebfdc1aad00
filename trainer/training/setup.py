"""A run's parts before its first step, each built from the settings alone: the data loaders
(ours or a plug-in's), the model on its device, what its throughput counts, the gradient noise
scale's probe, and a fresh run's --init-from weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainer.checkpoints import init_from
from trainer.common.errors import ConfigError
from trainer.data import Loaders, build_loaders
from trainer.data.plugin_loaders import plugin_loaders
from trainer.engines.base import Dist, GradientProbe
from trainer.models.build import checkpoint_activations, sharding_units
from trainer.models.gpt_sizes import GPT_SIZES, flops_per_token
from trainer.settings.train_config import TrainConfig, global_batch
from trainer.training.plugins import Plugins
from trainer.watch.mfu import peak_tflops
from trainer.watch.noise_scale import NoiseScale


@dataclass(frozen=True)
class ThroughputUnit:
    """What the run's throughput counts: images, a plug-in's samples or a language model's
    tokens; how many of them one batch holds; and, for a language model, the FLOPs per token
    and the device's peak that MFU divides by."""

    unit: str
    samples_per_batch: int
    flops_per_token: int
    peak_tflops: float | None


def build_run_loaders(
    cfg: TrainConfig, dist: Dist, plugins: Plugins, device: torch.device, channels_last: bool
) -> Loaders:
    """Our data sources, or a plug-in's datasets behind the same samplers."""
    data = plugins.data
    if data is not None:
        return plugin_loaders(cfg, data.train, data.val, dist.rank, dist.size, device)
    return build_loaders(cfg, dist.rank, dist.size, device, channels_last, dist.local_size, dist)


def build_run_model(
    cfg: TrainConfig,
    dist: Dist,
    plugins: Plugins,
    device: torch.device,
    channels_last: bool,
    outputs: int,
) -> nn.Module:
    """The model, on its device unless the engine shards it, in its memory layout, with its
    activations checkpointed when asked."""
    # Sharded engines build the model in host memory: fully_shard moves each block to the
    # GPU as it cuts it into shards, so the whole model never has to fit on one GPU.
    model = plugins.build_model(cfg, outputs)
    if not dist.sharded_state:
        model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if cfg.activation_checkpointing:
        checkpoint_activations(sharding_units(model))
    return model


def throughput_unit(cfg: TrainConfig, device: torch.device, outputs: int) -> ThroughputUnit:
    """What throughput counts for this run (``outputs``: a language model's vocabulary)."""
    unit = "tokens" if cfg.language_model else "samples" if cfg.plugin_data else "images"
    # Samples of one batch: images, or target tokens (the batch's windows x context).
    samples_per_batch, flops = cfg.batch_size, 0
    if cfg.language_model:
        size = GPT_SIZES[cfg.model]
        samples_per_batch = cfg.batch_size * (cfg.context or size.context)
        flops = flops_per_token(size, outputs)
    peak = peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    return ThroughputUnit(unit, samples_per_batch, flops, peak)


def noise_probe(
    cfg: TrainConfig, dist: Dist, device: torch.device
) -> tuple[GradientProbe | None, NoiseScale | None]:
    """--noise-scale-every: the probe the engine's reduction hooks show each local gradient,
    and the estimate made from it; (None, None) when off."""
    if not cfg.noise_scale_every:
        return None, None
    if dist.size < 2:  # one worker's gradient is the reduced gradient: no second batch
        raise ConfigError(
            f"noise_scale_every={cfg.noise_scale_every} with 1 worker: the noise scale "
            "compares each worker's gradient with their average; run 2 or more workers "
            "or set noise_scale_every=0"
        )
    # B_small: one worker's share of a step; B_big: the global batch.
    one_worker = global_batch(cfg.batch_size, 1, cfg.accumulation_steps)
    every_worker = global_batch(cfg.batch_size, dist.size, cfg.accumulation_steps)
    return GradientProbe(device), NoiseScale(one_worker, every_worker)


def start_from_weights(cfg: TrainConfig, dist: Dist, model: nn.Module) -> None:
    """A fresh run with --init-from: the weights read (by rank 0, or with sharded state by
    every rank) and loaded into the model (a collective); a failure on a reading rank
    stops every rank with its line."""
    reads = dist.sharded_state or dist.is_root
    report, error = None, None
    if reads:
        try:
            report = init_from.apply(model, cfg.init_from, cfg.init_strict)
        except init_from.InitError as err:
            error = (str(err), err.exit_code)
    if dist.any_rank(error is not None):
        line, code = dist.broadcast_object(error) or (
            "init_from: another rank could not read the weights (its log says why)",
            1,
        )
        raise init_from.InitError(line, code)
    if not dist.sharded_state:
        dist.broadcast_parameters(model)  # rank 0's weights on every rank
    if dist.is_root:
        print(report, flush=True)
