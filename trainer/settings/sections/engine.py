"""How the workers run: the distributed engine and how it reduces gradients (Horovod's cycle and
fusion buffer, FSDP's sharding group, accumulation, clipping, the noise scale, activation
checkpointing), then the device and numerics; each field checked here."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.common.errors import ConfigError
from trainer.settings.checks import check_choice, check_float_range, check_int_range
from trainer.settings.choices import (
    AMP_MODES,
    BACKENDS,
    DEVICES,
    GLOO_CPU_CYCLE_MS,
    GLOO_CPU_FUSION_MB,
    NCCL_CYCLE_MS,
    NCCL_FUSION_MB,
    SHARD_GROUPS,
    SWITCHES,
)
from trainer.settings.declare import setting


@dataclass(frozen=True)
class EngineSettings:
    """The engine, the gradients' way, the device and the precision."""

    backend: str = setting("horovod", f"distributed engine: {', '.join(BACKENDS)}")
    fp16_allreduce: bool = setting(False, "compress gradients to fp16 on the wire")
    # Horovod's background loop: every cycle it reduces the gradients that are ready (fused into
    # one buffer unless the fusion buffer is 0). A longer cycle batches more per round at the
    # cost of latency. 0: chosen by the engine.
    horovod_cycle_time_ms: float = setting(
        0.0,
        "Horovod: milliseconds between fusing and reducing ready gradients "
        f"(0: {NCCL_CYCLE_MS:g} with NCCL on GPUs, {GLOO_CPU_CYCLE_MS:g} with Gloo on CPUs)",
    )
    horovod_fusion_mb: int | None = setting(
        None,
        "Horovod: fusion buffer in MB (0: reduce each tensor on its own; "
        f"default: {NCCL_FUSION_MB} with NCCL on GPUs, {GLOO_CPU_FUSION_MB} with Gloo on CPUs)",
    )
    # Hybrid sharding ("node"): the all-gathers stay on NVLink, only gradient reductions cross
    # InfiniBand.
    shard_within: str = setting(
        "node",
        "fsdp: shard over the ranks of each node and replicate across nodes "
        "(node, hybrid sharding) or shard over every rank (world)",
    )
    accumulation_steps: int = setting(
        1, "micro-batches per optimizer step (Horovod backward_passes_per_step)"
    )
    # Read by trainer.watch.noise_scale.
    noise_scale_every: int = setting(
        0,
        "estimate the gradient noise scale (the largest useful batch, "
        "McCandlish et al. 2018) every N steps; horovod or ddp; 0: never",
    )
    grad_clip_norm: float = setting(
        0.0, "clip the gradients' global L2 norm to this before each step (0: off)"
    )
    activation_checkpointing: bool = setting(
        False,
        "recompute each block's activations in the backward pass "
        "(less memory, about a third more compute)",
    )
    device: str = setting("auto", f"{', '.join(DEVICES)}")
    # trainer.engines.cpu_affinity; off on GPUs, where a share should follow the GPU's NUMA node
    # (not measured here, no GPU).
    cpu_affinity: str = setting(
        "auto",
        f"bind each rank of a node to its own share of the CPUs: {', '.join(SWITCHES)} "
        "(auto: on with the CPU device, off on GPUs)",
    )
    amp: str = setting(
        "auto", f"mixed precision: {', '.join(AMP_MODES)} (auto: bf16 on GPU, off on CPU)"
    )
    channels_last: str = setting(
        "auto", f"NHWC memory format: {', '.join(SWITCHES)} (auto: on for GPU)"
    )
    compile: bool = setting(False, "torch.compile the model")

    def check_engine(self) -> None:
        """The engine and its reduction, then the device and numerics it runs with."""
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
