"""Command line -> ``TrainConfig``. Flags override ``--config FILE.yaml``, which overrides the
defaults in ``trainer.settings.train_config``. Errors are one line and exit code 2, never a
traceback."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainer.common.cli import OneLineParser
from trainer.common.errors import ConfigError, first_line
from trainer.settings.choices import (
    AMP_MODES,
    BACKENDS,
    CACHE_MODES,
    DATA_SOURCES,
    DEVICES,
    GLOO_CPU_CYCLE_MS,
    GLOO_CPU_FUSION_MB,
    LR_DECAYS,
    LR_SCALINGS,
    MODELS,
    NCCL_CYCLE_MS,
    NCCL_FUSION_MB,
    OPTIMIZERS,
    SWITCHES,
)
from trainer.settings.train_config import FIELD_NAMES, TrainConfig

# Help for every setting; keys are TrainConfig fields, so a new field without help fails a test.
HELP: dict[str, str] = {
    "model": f"network: {', '.join(MODELS)}, or your own as pkg.module:factory "
    "(factory(cfg, **model_args) -> torch.nn.Module, imported from the working directory or "
    "PYTHONPATH)",
    "model_args": "a plug-in model's keyword arguments, a YAML mapping like '{width: 32}'",
    "num_classes": "classifier outputs",
    "loss": "your own loss as pkg.module:function(outputs, targets) -> the batch's mean loss "
    "(default: cross-entropy over class scores)",
    "metric": "your own metric as pkg.module:function(outputs, targets) -> how many samples "
    "are right, logged as accuracy (default: top-1 with the default loss)",
    "init_from": "start from these weights when the run has no checkpoint of its own: a "
    "safetensors file, a torch state dict, or another run's checkpoint (file or sharded "
    "folder), as a local path or an https:// Blob URL (read with the machine's identity)",
    "init_strict": "--init-from must match every key of the model (--no-init-strict: load "
    "those that match and report the missing and unexpected ones)",
    "context": "language models: tokens per sample (default: the model's context)",
    "vocab_size": "language models: vocabulary (default: the token shards' manifest, or 257 "
    "byte-level tokens with synthetic data)",
    "data": f"input: {', '.join(DATA_SOURCES)}, or your own as pkg.module:factory "
    "(factory(cfg, **data_args) -> a map-style Dataset of (input, target), or (train, val))",
    "data_args": "a plug-in dataset's keyword arguments, a YAML mapping like '{size: 512}'",
    "data_dir": "--data folder: root with train/<class>/ (and val/); --data shards: the "
    "folder with manifest.json (dt-data prepare); --data tokens: the folder "
    "dt-data prepare-text wrote",
    "image_size": "training crop in pixels",
    "batch_size": "images per worker per step (the global batch multiplies by workers)",
    "synthetic_size": "images in one synthetic epoch (all workers together)",
    "synthetic_pool": "distinct random images kept on the device for synthetic data",
    "loader_workers": "DataLoader processes per worker for folders and shards (forkserver)",
    "cache": f"keep the dataset in RAM after the first read: {', '.join(CACHE_MODES)}",
    "cache_scope": "with --cache: node (one copy per node in shared memory, filled by the "
    "node's ranks together) or rank (each rank caches only its fixed part of the samples)",
    "shuffle_buffer": "samples in the shuffle buffer over each rank's shards (--data shards)",
    "on_bad_image": "an image that does not decode while training (--data folder or shards): "
    "fail (stop, naming it) or skip (train on the next image instead; counted as "
    "skipped_images in the metrics and the run summary)",
    "epochs": "epochs to train",
    "max_steps": "stop when the global optimizer step reaches N (steps before a resume count)",
    "run_steps": "stop this invocation after N more steps (checkpoint, exit 0, resume later)",
    "lr": "single-worker learning rate, scaled by --lr-scaling",
    "optimizer": f"{', '.join(OPTIMIZERS)}",
    "momentum": "momentum for sgd and lars",
    "weight_decay": "L2 penalty (never applied to BN and bias parameters)",
    "lars_trust_coefficient": "LARS trust coefficient (eta)",
    "lr_scaling": f"scale lr with workers: {', '.join(LR_SCALINGS)}",
    "warmup_epochs": "linear warmup from --lr to the scaled rate (Goyal et al. 2017)",
    "lr_decay": f"after warmup: {', '.join(LR_DECAYS)}",
    "lr_step_epochs": "epochs where step decay multiplies the rate, comma-separated",
    "lr_step_factor": "step decay multiplier",
    "lr_poly_power": "poly decay exponent",
    "label_smoothing": "label smoothing for the cross-entropy loss",
    "backend": f"distributed engine: {', '.join(BACKENDS)}",
    "fp16_allreduce": "compress gradients to fp16 on the wire",
    "horovod_cycle_time_ms": "Horovod: milliseconds between fusing and reducing ready gradients "
    f"(0: {NCCL_CYCLE_MS:g} with NCCL on GPUs, {GLOO_CPU_CYCLE_MS:g} with Gloo on CPUs)",
    "horovod_fusion_mb": "Horovod: fusion buffer in MB (0: reduce each tensor on its own; "
    f"default: {NCCL_FUSION_MB} with NCCL on GPUs, {GLOO_CPU_FUSION_MB} with Gloo on CPUs)",
    "shard_within": "fsdp: shard over the ranks of each node and replicate across nodes "
    "(node, hybrid sharding) or shard over every rank (world)",
    "accumulation_steps": "micro-batches per optimizer step (Horovod backward_passes_per_step)",
    "noise_scale_every": "estimate the gradient noise scale (the largest useful batch, "
    "McCandlish et al. 2018) every N steps; horovod or ddp; 0: never",
    "grad_clip_norm": "clip the gradients' global L2 norm to this before each step (0: off)",
    "activation_checkpointing": "recompute each block's activations in the backward pass "
    "(less memory, about a third more compute)",
    "device": f"{', '.join(DEVICES)}",
    "cpu_affinity": f"bind each rank of a node to its own share of the CPUs: {', '.join(SWITCHES)} "
    "(auto: on with the CPU device, off on GPUs)",
    "amp": f"mixed precision: {', '.join(AMP_MODES)} (auto: bf16 on GPU, off on CPU)",
    "channels_last": f"NHWC memory format: {', '.join(SWITCHES)} (auto: on for GPU)",
    "compile": "torch.compile the model",
    "output_dir": "folder for checkpoints/, metrics.jsonl and tensorboard/",
    "checkpoint_every": "also checkpoint every N steps (0: only at epoch ends and on exit)",
    "keep_checkpoints": "checkpoints to keep",
    "checkpoint_async": "write checkpoints in the background while training goes on (at most "
    "one in flight; the run's last save waits until written)",
    "log_every": "log metrics every N steps",
    "seed": "random seed (same on every worker)",
    "profile_steps": "record a torch.profiler trace of optimizer steps A-B (for example 20-25) on "
    "every rank, into tensorboard/profile/rank<N>_<host>.<time>.pt.trace.json (open it in "
    "Perfetto UI or chrome://tracing); empty: off",
    "debug_rank": "this rank waits for a debugger (debugpy, Debug Adapter Protocol) on "
    "--debug-port before training; every other rank waits at a barrier until it attaches",
    "debug_port": "TCP port the --debug-rank rank listens on, on every interface (1024-65535)",
    "preflight_min_busbw": "before training, stop if allreduce bus bandwidth (GB/s) is lower; "
    "0 skips (a Batch job sets it from its VM size, trainer/launch/node_sizes.py)",
    "metrics_upload_url": "rank 0 copies metrics.jsonl and tensorboard/ to this Blob folder "
    "(https://<account>.blob.core.windows.net/<container>/<prefix>/) with the machine's "
    "identity, every --metrics-upload-minutes and at the end; empty: off",
    "metrics_upload_minutes": "minutes between live uploads (fractions allowed)",
    "outputs_url": "when the run ends, rank 0 copies its results/ (final weights, config, "
    "metrics, evaluation, manifest last) to this Blob folder with the machine's identity; "
    "empty: they stay in --output-dir",
    "checkpoint_mirror_url": "rank 0 copies each finished checkpoint to this Blob folder in the "
    "background with the machine's identity (verified, its manifest last); a resume takes the "
    "newest verified checkpoint of --output-dir and this folder; empty: off",
    "checkpoint_mirror_keep": "mirrored checkpoints to keep in --checkpoint-mirror-url",
    # Watching the ranks (trainer.watch.rank_watch).
    "straggler_every": "every N steps the ranks share their step and data-wait times and GPU "
    "samples (one allreduce); a slow rank is logged as a kind: straggler record; 0: never",
    "straggler_margin": "name a rank whose data wait or own work per step exceeds the other "
    "ranks' median by more than this fraction of their median step",
    "gpu_telemetry_seconds": "each rank samples its GPU (NVML: utilisation, memory, "
    "temperature, power, ECC, XID) every N seconds on a thread; kind: gpu records; 0: off",
    "step_timeout_minutes": "a rank that completes no step, evaluation or checkpoint save for N "
    "minutes writes its Python stacks and collectives to <output-dir>/watchdog/ and exits with "
    "86; 0: 20 median steps, at least 10 minutes",
}
_BOOLEAN = {
    "fp16_allreduce",
    "compile",
    "activation_checkpointing",
    "checkpoint_async",
    "init_strict",
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="dt-train",
        description="Distributed training (Horovod, DDP, FSDP or one process).",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument("--config", type=Path, help="YAML file of settings; flags override it")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=False,
        help="validate the config, build the model, print its size and exit",
    )
    for name in FIELD_NAMES:
        flag = "--" + name.replace("_", "-")
        if name in _BOOLEAN:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=HELP[name])
        else:
            parser.add_argument(flag, metavar=name.upper(), help=HELP[name])
    return parser


@dataclass(frozen=True)
class Request:
    config: TrainConfig
    dry_run: bool


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"config={path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config={path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
            f"{err.start}); save it as UTF-8 (for example iconv -f latin1 -t utf-8)"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config={path}: not valid YAML{where}") from None
    except (ValueError, RecursionError) as err:
        # A value YAML parses but cannot build (a date like 2026-02-30), or nesting deeper
        # than Python's recursion limit.
        reason = first_line(err)
        raise ConfigError(f"config={path}: not a usable YAML document ({reason})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"config={path}: must be a mapping of settings, got {type(loaded).__name__}"
        )
    return loaded


def parse(argv: Sequence[str] | None = None) -> Request:
    """Parse flags and the optional YAML file; raises ConfigError, exits 2 on unknown flags."""
    namespace = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = {}
    if "config" in namespace:
        values.update(_read_yaml(namespace["config"]))
    values.update({k: v for k, v in namespace.items() if k in FIELD_NAMES})
    return Request(TrainConfig.from_mapping(values), bool(namespace.get("dry_run")))


def to_flags(values: dict[str, Any]) -> list[str]:
    """Settings -> the flags that reproduce them (the inverse of ``parse``), for job commands."""
    flags: list[str] = []
    for name, value in values.items():
        if name not in FIELD_NAMES:
            raise ConfigError(f"unknown setting {name!r}")
        flag = "--" + name.replace("_", "-")
        if name in _BOOLEAN:
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):
            if value:  # JSON is YAML's flow style: parse() reads it back
                flags += [flag, json.dumps(value, sort_keys=True)]
        elif isinstance(value, list | tuple):
            flags += [flag, ",".join(str(v) for v in value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags
