"""The trainer's settings: one frozen dataclass, validated once, before anything runs.

Every default lives here. A YAML file (``--config``) and the command line both end up in
``TrainConfig.from_mapping``; a bad value raises ``ConfigError`` with one line naming the setting,
the value and what would be valid. The batch sizes the settings sum to over the workers
(``global_batch``, ``global_micro_batch``) are computed here, once.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import ConfigError
from trainer.common.values import hashable, shown
from trainer.models.gpt_sizes import GPT_SIZES
from trainer.settings.checks import (
    check_choice,
    check_choice_or_plugin,
    check_float_range,
    check_int_range,
    check_plugin_ref,
    coerce,
    init_source,
    profile_window,
)
from trainer.settings.choices import (
    AMP_MODES,
    BACKENDS,
    BAD_IMAGE_POLICIES,
    CACHE_MODES,
    CACHE_SCOPES,
    DATA_SOURCES,
    DEVICES,
    LM_DATA,
    LM_MODELS,
    LR_DECAYS,
    LR_SCALINGS,
    MAX_EPOCHS,
    MAX_STEPS,
    MODELS,
    OPTIMIZERS,
    REMOVED_SETTINGS,
    SHARD_GROUPS,
    SWITCHES,
    is_plugin_ref,
)


@dataclass(frozen=True)
class TrainConfig:
    # What to train.
    # A built-in (MODELS) or a plug-in ``pkg.module:factory`` called as
    # ``factory(cfg, **model_args)`` (trainer.training.plugins).
    model: str = "resnet50"
    model_args: dict[str, Any] = field(default_factory=dict)
    num_classes: int = 1000
    # Plug-in hooks: ``loss(outputs, targets)`` and ``metric(outputs, targets)`` ("": built-in).
    loss: str = ""
    metric: str = ""
    # Start from these weights when the run has no checkpoint of its own: a local file or
    # folder, or a Blob URL (trainer.checkpoints.init_from); strict: every key must match.
    init_from: str = ""
    init_strict: bool = True
    # Language models: tokens per sample (None: the model's context) and the vocabulary (None:
    # the token shards' manifest says, or 257 byte-level tokens for synthetic data).
    context: int | None = None
    vocab_size: int | None = None
    # Data. ``batch_size`` is per worker; the global batch is batch_size x workers x accumulation
    # (``global_batch``).
    # A built-in source (DATA_SOURCES) or a plug-in ``pkg.module:factory`` called as
    # ``factory(cfg, **data_args)``.
    data: str = "synthetic"
    data_args: dict[str, Any] = field(default_factory=dict)
    data_dir: str | None = None
    image_size: int = 224
    batch_size: int = 32
    synthetic_size: int = 12_800
    synthetic_pool: int = 256
    loader_workers: int = 4
    cache: str = "none"
    cache_scope: str = "node"
    shuffle_buffer: int = 1000
    on_bad_image: str = "fail"
    # How long.
    epochs: int = 90
    max_steps: int | None = None
    run_steps: int | None = None
    # Optimization. ``lr`` is the single-worker rate; it is scaled by the number of workers.
    lr: float = 0.1
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 1e-4
    lars_trust_coefficient: float = 0.001
    lr_scaling: str = "linear"
    warmup_epochs: float = 5.0
    lr_decay: str = "step"
    lr_step_epochs: tuple[int, ...] = (30, 60, 80)
    lr_step_factor: float = 0.1
    lr_poly_power: float = 2.0
    label_smoothing: float = 0.0
    # Distribution.
    backend: str = "horovod"
    fp16_allreduce: bool = False
    # Horovod's background loop: every cycle it reduces the gradients that are ready (fused into
    # one buffer unless the fusion buffer is 0). A longer cycle batches more per round at the
    # cost of latency. 0: chosen by the engine (NCCL_CYCLE_MS, GLOO_CPU_CYCLE_MS above).
    horovod_cycle_time_ms: float = 0.0
    # The fusion buffer; 0: each tensor reduced on its own; None: chosen by the engine
    # (NCCL_FUSION_MB, GLOO_CPU_FUSION_MB above).
    horovod_fusion_mb: int | None = None
    # FSDP (backend fsdp): shard parameters, gradients and optimizer state over every rank
    # ("world") or over the ranks of each node, replicated across nodes ("node", hybrid
    # sharding: the all-gathers stay on NVLink, only gradient reductions cross InfiniBand).
    shard_within: str = "node"
    accumulation_steps: int = 1
    # Estimate the gradient noise scale every N steps (trainer.watch.noise_scale); 0: never.
    noise_scale_every: int = 0
    # Clip the gradients' global L2 norm to this before each step; 0: no clipping.
    grad_clip_norm: float = 0.0
    # Recompute each block's activations in the backward pass (less memory, ~1/3 more compute).
    activation_checkpointing: bool = False
    # Precision and speed.
    device: str = "auto"
    # Each rank of a node bound to its own contiguous share of the node's CPUs
    # (trainer.engines.cpu_affinity); auto: on with the CPU device, off on GPUs (where a share
    # should follow the GPU's NUMA node; not measured here, no GPU).
    cpu_affinity: str = "auto"
    amp: str = "auto"
    channels_last: str = "auto"
    compile: bool = False
    # Output.
    output_dir: str = "runs/default"
    checkpoint_every: int = 0
    # Write checkpoints in the background: a step waits only for an in-memory copy, training
    # goes on while the bytes reach storage, at most one write in flight (the last save of a
    # run, and a SIGTERM's, wait until written).
    checkpoint_async: bool = True
    keep_checkpoints: int = 3
    log_every: int = 10
    seed: int = 42
    # Diagnosis. A torch.profiler trace of optimizer steps "A-B" per rank, written beside the
    # TensorBoard events (trainer.watch.profiling; "": off).
    profile_steps: str = ""
    # This rank waits for a debugger (debugpy) on debug_port before training, every other rank
    # at a barrier until it attaches (trainer.watch.debugger; None: off).
    debug_rank: int | None = None
    debug_port: int = 5678
    # Stop before training when the allreduce bus bandwidth (GB/s) is below this; 0: skip.
    preflight_min_busbw: float = 0.0
    # Rank 0 copies metrics.jsonl and tensorboard/ to this Blob folder URL every N minutes and
    # at the end ("": off). Fractions of a minute are allowed (short runs, tests).
    metrics_upload_url: str = ""
    metrics_upload_minutes: float = 5.0
    # Rank 0 copies the finished run's results/ (trainer.outputs.results) to this Blob folder URL
    # ("": they stay in output_dir only).
    outputs_url: str = ""
    # Rank 0 copies each finished checkpoint to this Blob folder URL in the background, the newest
    # N kept; a resume takes the newest verified copy of the local folder and it
    # (trainer.checkpoints.mirror; "": off).
    checkpoint_mirror_url: str = ""
    checkpoint_mirror_keep: int = 2
    # Watching the ranks (trainer.watch.rank_watch). Every N steps the ranks share their step and
    # data-wait times and GPU samples in one allreduce (0: never, and no GPU samples either).
    straggler_every: int = 50
    # A rank is named when its data wait or own work exceeds the others' median by more than
    # this fraction of their median step (0.5: half a step lost per step).
    straggler_margin: float = 0.5
    # Each rank samples its GPU through NVML every N seconds on a thread (0: off; CPUs: never).
    gpu_telemetry_seconds: float = 10.0
    # A rank whose training makes no progress (no step, evaluation or save ends) for this many
    # minutes writes its stacks and collectives and exits (trainer.watch.watchdog; 0: derived from
    # the median step, at least 10 minutes).
    step_timeout_minutes: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Build from YAML keys (snake_case or CLI kebab-case), rejecting unknown ones."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for raw_key, value in values.items():
            key = str(raw_key).replace("-", "_")
            if key in REMOVED_SETTINGS:
                raise ConfigError(f"{raw_key}: was removed: {REMOVED_SETTINGS[key]}")
            if key not in known:
                # Naming the nearest settings keeps the line short; there are over 70.
                close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
                hint = f"did you mean {', '.join(close)}? " if close else ""
                raise ConfigError(
                    f"unknown setting {shown(raw_key)}: {hint}dt-train --help lists every setting"
                )
            kwargs[key] = coerce(key, value, known[key].type)
        return cls(**kwargs)

    def __hash__(self) -> int:
        # The plug-ins' argument mappings are dicts: hashed by their sorted items, so a config
        # stays hashable as a frozen dataclass is.
        return hash(tuple(hashable(getattr(self, name)) for name in FIELD_NAMES))

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["lr_step_epochs"] = list(self.lr_step_epochs)
        return out

    @property
    def plugin_data(self) -> bool:
        return is_plugin_ref(self.data)

    @property
    def language_model(self) -> bool:
        return self.model in LM_MODELS

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Every setting against its range and the others it depends on, in a fixed order, so
        the first problem found is always the same one."""
        self._check_model_and_data()
        self._check_plugins()
        self._check_loading()
        self._check_schedule()
        self._check_engine()
        self._check_outputs()

    def _check_model_and_data(self) -> None:
        """The model, and the data it can train on."""
        check_choice_or_plugin("model", self.model, MODELS)
        check_int_range("num_classes", self.num_classes, 2, 1_000_000)
        check_choice_or_plugin("data", self.data, DATA_SOURCES)
        if self.language_model and self.data not in LM_DATA:
            raise ConfigError(
                f"data={self.data}: {self.model} trains on --data tokens (dt-data "
                f"prepare-text) or synthetic"
            )
        if not self.language_model and self.data == "tokens":
            raise ConfigError(
                f"data=tokens: {self.model} classifies images; use a language model "
                f"({', '.join(LM_MODELS)}) or --data folder/shards"
            )
        if self.data == "tokens" and not self.data_dir:
            raise ConfigError(
                "data_dir=None: --data tokens needs --data-dir DIR (dt-data "
                "prepare-text's output, with manifest.json)"
            )
        for name in ("context", "vocab_size"):
            if getattr(self, name) is not None and not self.language_model:
                raise ConfigError(
                    f"{name}={shown(getattr(self, name))}: only language models "
                    f"({', '.join(LM_MODELS)}) have one; delete the setting"
                )
        if self.context is not None:
            check_int_range("context", self.context, 1, GPT_SIZES[self.model].context)
        if self.vocab_size is not None:
            check_int_range("vocab_size", self.vocab_size, 2, 1_000_000)
        if self.data == "folder" and not self.data_dir:
            raise ConfigError("data_dir=None: --data folder needs --data-dir DIR (with train/)")
        if self.data == "shards" and not self.data_dir:
            raise ConfigError(
                "data_dir=None: --data shards needs --data-dir DIR (with manifest.json)"
            )

    def _check_plugins(self) -> None:
        """A team's own model, data and hooks (trainer.training.plugins), and the weights a run
        starts from (trainer.checkpoints.init_from). Here only their form: importing them needs
        torch."""
        for name in ("loss", "metric"):
            if ref := getattr(self, name):
                check_plugin_ref(name, ref)
                if self.language_model:
                    raise ConfigError(
                        f"{name}={ref}: {self.model} trains on next-token cross-entropy; delete "
                        "the setting"
                    )
        for name, owner in (("model_args", "model"), ("data_args", "data")):
            args = getattr(self, name)
            if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
                raise ConfigError(f"{name}={shown(args)}: expected a mapping of keyword arguments")
            if args and not is_plugin_ref(getattr(self, owner)):
                raise ConfigError(
                    f"{name}={shown(args)}: only a plug-in {owner} (pkg.module:factory) takes "
                    "arguments; delete the setting"
                )
        if self.init_from:
            init_source(self.init_from)

    def _check_loading(self) -> None:
        """The memory cache and the data loader."""
        check_choice("cache", self.cache, CACHE_MODES)
        if self.cache != "none" and self.data == "tokens":
            raise ConfigError(
                f"cache={self.cache}: token shards are memory-mapped (the page cache holds them); "
                "use --cache none"
            )
        if self.cache != "none" and self.plugin_data:
            raise ConfigError(
                f"cache={self.cache}: the cache serves --data folder and shards; a plug-in "
                "dataset keeps what it likes in memory itself; use --cache none"
            )
        if self.cache != "none" and self.data == "synthetic":
            raise ConfigError(
                f"cache={self.cache}: synthetic data is already in memory; use --cache none"
            )
        check_choice("cache_scope", self.cache_scope, CACHE_SCOPES)
        check_int_range("shuffle_buffer", self.shuffle_buffer, 1, 10_000_000)
        check_choice("on_bad_image", self.on_bad_image, BAD_IMAGE_POLICIES)
        check_int_range("image_size", self.image_size, 16, 1024)
        check_int_range("batch_size", self.batch_size, 1, 65_536)
        check_int_range("synthetic_size", self.synthetic_size, 1, 100_000_000)
        check_int_range("synthetic_pool", self.synthetic_pool, 1, 65_536)
        check_int_range("loader_workers", self.loader_workers, 0, 256)

    def _check_schedule(self) -> None:
        """How long to train, and the optimizer with its learning-rate schedule."""
        check_int_range("epochs", self.epochs, 1, MAX_EPOCHS)
        if self.max_steps is not None:
            check_int_range("max_steps", self.max_steps, 1, MAX_STEPS)
        if self.run_steps is not None:
            check_int_range("run_steps", self.run_steps, 1, MAX_STEPS)
        check_float_range("lr", self.lr, 0.0, 1000.0, low_open=True)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_float_range("momentum", self.momentum, 0.0, 1.0, high_open=True)
        check_float_range("weight_decay", self.weight_decay, 0.0, 1.0)
        check_float_range(
            "lars_trust_coefficient", self.lars_trust_coefficient, 0.0, 1.0, low_open=True
        )
        check_choice("lr_scaling", self.lr_scaling, LR_SCALINGS)
        check_float_range("warmup_epochs", self.warmup_epochs, 0.0, float(self.epochs))
        check_choice("lr_decay", self.lr_decay, LR_DECAYS)
        if list(self.lr_step_epochs) != sorted(set(self.lr_step_epochs)) or any(
            not 1 <= e <= MAX_EPOCHS for e in self.lr_step_epochs
        ):
            raise ConfigError(
                f"lr_step_epochs={shown(list(self.lr_step_epochs))}: must be increasing epochs "
                f"in 1..{MAX_EPOCHS}"
            )
        check_float_range("lr_step_factor", self.lr_step_factor, 0.0, 1.0, low_open=True)
        check_float_range("lr_poly_power", self.lr_poly_power, 0.0, 10.0, low_open=True)
        check_float_range("label_smoothing", self.label_smoothing, 0.0, 1.0, high_open=True)
        check_float_range("preflight_min_busbw", self.preflight_min_busbw, 0.0, 100_000.0)

    def _check_engine(self) -> None:
        """The distributed engine, and the device and numerics it runs with."""
        check_choice("backend", self.backend, BACKENDS)
        if self.fp16_allreduce and self.backend == "local":
            raise ConfigError(
                "fp16_allreduce=true with backend=local: compression needs horovod or ddp"
            )
        check_float_range("horovod_cycle_time_ms", self.horovod_cycle_time_ms, 0.0, 1000.0)
        if self.horovod_fusion_mb is not None:
            check_int_range("horovod_fusion_mb", self.horovod_fusion_mb, 0, 4096)
        check_choice("shard_within", self.shard_within, SHARD_GROUPS)
        check_int_range("accumulation_steps", self.accumulation_steps, 1, 1024)
        check_float_range("grad_clip_norm", self.grad_clip_norm, 0.0, 1e6)
        check_int_range("noise_scale_every", self.noise_scale_every, 0, 10**9)
        if self.noise_scale_every and self.backend not in ("horovod", "ddp"):
            raise ConfigError(
                f"noise_scale_every={self.noise_scale_every} with backend={self.backend}: the "
                "noise scale compares each worker's gradient with the reduced one, taken in "
                "Horovod's or DDP's reduction hooks; use --backend horovod or ddp, or 0"
            )
        if self.noise_scale_every and self.amp == "fp16":
            raise ConfigError(
                f"noise_scale_every={self.noise_scale_every} with amp=fp16: the loss scale "
                "changes the local gradients' norms; use --amp bf16 or off, or 0"
            )
        check_choice("device", self.device, DEVICES)
        check_choice("cpu_affinity", self.cpu_affinity, SWITCHES)
        check_choice("amp", self.amp, AMP_MODES)
        check_choice("channels_last", self.channels_last, SWITCHES)

    def _check_outputs(self) -> None:
        """Checkpoints, metrics and results, and the tools that watch a run."""
        if not self.output_dir:
            raise ConfigError("output_dir='': give a folder for checkpoints and metrics")
        check_int_range("checkpoint_every", self.checkpoint_every, 0, 10**12)
        check_int_range("keep_checkpoints", self.keep_checkpoints, 1, 1000)
        check_int_range("log_every", self.log_every, 1, 10**9)
        check_int_range("seed", self.seed, 0, 2**32 - 1)
        if self.profile_steps:
            profile_window(self.profile_steps)
        if self.debug_rank is not None:
            # The upper bound is the world size, known once the workers start
            # (trainer.watch.debugger).
            check_int_range("debug_rank", self.debug_rank, 0, 1_000_000)
        check_int_range("debug_port", self.debug_port, 1024, 65535)
        for name in ("metrics_upload_url", "outputs_url"):
            if url := getattr(self, name):
                try:
                    BlobFolder.parse(url)
                except ValueError as err:
                    raise ConfigError(f"{name}={url!r}: {err}") from None
        check_float_range("metrics_upload_minutes", self.metrics_upload_minutes, 0.01, 1440.0)
        self._check_mirror()
        self._check_rank_watch()
        self._check_watchdog()

    def _check_mirror(self) -> None:
        """The checkpoint mirror in Blob storage (trainer.checkpoints.mirror)."""
        if url := self.checkpoint_mirror_url:
            try:
                BlobFolder.parse(url)
            except ValueError as err:
                raise ConfigError(f"checkpoint_mirror_url={url!r}: {err}") from None
        check_int_range("checkpoint_mirror_keep", self.checkpoint_mirror_keep, 1, 1000)

    def _check_watchdog(self) -> None:
        """The step watchdog (trainer.watch.watchdog): 0 derives the limit from the steps."""
        minutes = self.step_timeout_minutes
        if minutes != 0:
            try:
                check_float_range("step_timeout_minutes", minutes, 0.05, 10080.0)
            except ConfigError:
                raise ConfigError(
                    f"step_timeout_minutes={shown(minutes)}: must be 0 (derived from the median "
                    "step, at least 10 minutes) or a number of minutes in [0.05, 10080]"
                ) from None

    def _check_rank_watch(self) -> None:
        """Stragglers and GPU telemetry (trainer.watch.rank_watch)."""
        check_int_range("straggler_every", self.straggler_every, 0, 10**9)
        check_float_range("straggler_margin", self.straggler_margin, 0.05, 100.0)
        seconds = self.gpu_telemetry_seconds
        if seconds != 0:
            try:
                check_float_range("gpu_telemetry_seconds", seconds, 0.1, 3600.0)
            except ConfigError:
                raise ConfigError(
                    f"gpu_telemetry_seconds={shown(seconds)}: must be 0 (off) or a number of "
                    "seconds in [0.1, 3600]"
                ) from None


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(TrainConfig))
DEFAULTS = TrainConfig()


def global_micro_batch(batch_size: int, workers: int) -> int:
    """One micro-batch of every worker: the samples the workers read together per forward
    pass, and a sampler's stride through the epoch's order."""
    return batch_size * workers


def global_batch(batch_size: int, workers: int, accumulation_steps: int) -> int:
    """The global batch: the samples of one optimizer step over every worker, each worker's
    ``accumulation_steps`` micro-batches of ``batch_size``."""
    return global_micro_batch(batch_size, workers) * accumulation_steps
