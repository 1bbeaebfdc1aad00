"""The values the trainer's settings may take: the models, data sources, engines, optimizers,
schedules and switches, the engines' cycle and fusion defaults, the plug-in reference form, and
the settings that were removed with what replaced them. Torch-free (infra and dt-plan read it)."""

from __future__ import annotations

import re
from typing import Any

from trainer.models.gpt_sizes import GPT_SIZES

IMAGE_MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "tiny")


# GPT-style decoders (trainer.models.gpt): next-token prediction on --data tokens or synthetic
# tokens.
LM_MODELS = tuple(GPT_SIZES)


MODELS = IMAGE_MODELS + LM_MODELS


DATA_SOURCES = ("synthetic", "folder", "shards", "tokens")


# The data each kind of model trains on.
LM_DATA = ("synthetic", "tokens")


CACHE_MODES = ("none", "bytes", "decoded")


CACHE_SCOPES = ("node", "rank")


# An image that does not decode mid-training: stop naming it, or replace it and count it.
BAD_IMAGE_POLICIES = ("fail", "skip")


OPTIMIZERS = ("sgd", "adamw", "lars")


BACKENDS = ("horovod", "ddp", "fsdp", "local")


# The engines started the way torchrun starts workers (RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT in each worker's environment); horovod is started
# with Horovod's Gloo rendezvous variables instead, local with nothing.
TORCH_DISTRIBUTED_BACKENDS = ("ddp", "fsdp")


# FSDP's sharding group: every rank of the run (ZeRO-3 over the world), or the ranks of one node
# (hybrid: shard over NVLink inside a node, replicate across nodes over InfiniBand).
SHARD_GROUPS = ("world", "node")


# Horovod's cycle time when the config leaves it to the engine (HorovodDist). With NCCL on GPUs:
# Horovod's own default (steps take tens of milliseconds there; a longer cycle delays the last
# gradients; not measured here, no GPU). With Gloo on CPUs: 20 ms. With the 4 MB buffer below,
# 2 workers on 2 cores, interleaved rounds: 10/20/50 ms gave medians of 70.2/75.0/71.6 images/s
# (DDP 73.3), 20 ms ahead of 50 ms in 3 of 4 rounds; an earlier run of 5/20/50 ms gave
# 59.0/64.9/59.2, 20 ms ahead in 2 of 3. Horovod's own 1 ms negotiates every millisecond on the
# cores the ranks compute on (efficiency 0.48-0.69 over three bench.scaling runs, against
# 0.74-0.86 for this choice).
NCCL_CYCLE_MS = 1.0


GLOO_CPU_CYCLE_MS = 20.0


# The fusion buffer when the config leaves it to the engine. With NCCL: Horovod's own 128 MB (one
# kernel launch per fused batch matters on GPUs). With Gloo on CPUs: 4 MB. A gradient larger than
# the threshold is reduced alone in its own memory (GlooAllreduce::Execute in
# horovod/common/ops/gloo_operations.cc: one entry skips the buffer); the small ones (biases,
# norms, the first layers' convolutions) are fused, so a step issues a few dozen fewer
# allreduces, each with its own negotiation and Gloo round trips, for copies of a few MB. A large
# buffer copies every gradient in and out on the cores the ranks compute on. Interleaved
# 2-worker bench.scaling-style runs, ResNet-18 (3 rounds each; images/s, medians): 0 / 1 / 4 MB
# gave 66.0 / 71.5 / 72.9, with 4 MB ahead of 0 in every round; 4 / 8 / 16 / 32 MB gave
# 70.9 / 68.7 / 65.6 / 65.4, with 4 MB ahead in every round; DDP 74-77 in the same runs.
# (Earlier: with the 128 MB buffer Horovod reached 0.909 of DDP's throughput.)
NCCL_FUSION_MB = 128


GLOO_CPU_FUSION_MB = 4


LR_SCALINGS = ("linear", "sqrt", "none")


# Epochs a run may train (--epochs, each of --lr-step-epochs).
MAX_EPOCHS = 100_000


# Optimizer steps a run may count to (--max-steps, --run-steps, a sweep's --steps).
MAX_STEPS = 10**12


LR_DECAYS = ("step", "cosine", "poly")


AMP_MODES = ("auto", "off", "bf16", "fp16")


DEVICES = ("auto", "cpu", "cuda")


SWITCHES = ("auto", "on", "off")


# A team's own model, data, loss or metric (trainer.training.plugins): ``pkg.module:name``, found on
# sys.path (the working directory or PYTHONPATH).
PLUGIN_REF = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


PLUGIN_EXAMPLE = "examples.custom_model.model:build"


# Settings an earlier version had, and why they are gone: a file that still sets one gets the
# reason, not a bare "unknown setting".
REMOVED_SETTINGS = {
    # Horovod implements Adasum's reduction over MPI only; every Horovod this tool builds (the
    # image, the set-up script) is Gloo-only, because the launcher starts workers itself through
    # Horovod's Gloo rendezvous, without mpirun (docs/trainer.md, "No Adasum").
    "adasum": "Horovod's Adasum needs an MPI build of Horovod and mpirun, and this tool's "
    "Horovod is built with Gloo only; delete the setting (gradients are averaged)",
}


def is_plugin_ref(value: Any) -> bool:
    """Whether ``value`` names a plug-in (``pkg.module:name``) rather than a built-in."""
    return isinstance(value, str) and ":" in value
