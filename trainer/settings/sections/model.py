"""What to train: the model (built-in or plug-in) and its arguments, the loss and metric hooks,
the weights a run starts from, and a language model's context and vocabulary; each field checked
here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.common.errors import ConfigError
from trainer.common.values import shown
from trainer.models.gpt_sizes import GPT_SIZES
from trainer.settings.checks import (
    check_choice_or_plugin,
    check_int_range,
    check_plugin_args,
    check_plugin_ref,
    init_source,
)
from trainer.settings.choices import LM_MODELS, MODELS
from trainer.settings.declare import setting


@dataclass(frozen=True)
class ModelSettings:
    """The model and where its weights start."""

    # A built-in (MODELS) or a plug-in ``pkg.module:factory`` called as
    # ``factory(cfg, **model_args)`` (trainer.training.plugins).
    model: str = setting(
        "resnet50",
        f"network: {', '.join(MODELS)}, or your own as pkg.module:factory "
        "(factory(cfg, **model_args) -> torch.nn.Module, imported from the working directory or "
        "PYTHONPATH)",
    )
    # setting() gives each instance its own copy of a dict default.
    model_args: dict[str, Any] = setting(  # noqa: RUF009
        {}, "a plug-in model's keyword arguments, a YAML mapping like '{width: 32}'"
    )
    num_classes: int = setting(1000, "classifier outputs")
    # Plug-in hooks: ``loss(outputs, targets)`` and ``metric(outputs, targets)`` ("": built-in).
    loss: str = setting(
        "",
        "your own loss as pkg.module:function(outputs, targets) -> the batch's mean loss "
        "(default: cross-entropy over class scores)",
    )
    metric: str = setting(
        "",
        "your own metric as pkg.module:function(outputs, targets) -> how many samples "
        "are right, logged as accuracy (default: top-1 with the default loss)",
    )
    # Read by trainer.checkpoints.init_from; strict: every key must match.
    init_from: str = setting(
        "",
        "start from these weights when the run has no checkpoint of its own: a "
        "safetensors file, a torch state dict, or another run's checkpoint (file or sharded "
        "folder), as a local path or an https:// Blob URL (read with the machine's identity)",
    )
    init_strict: bool = setting(
        True,
        "--init-from must match every key of the model (--no-init-strict: load "
        "those that match and report the missing and unexpected ones)",
    )
    context: int | None = setting(
        None, "language models: tokens per sample (default: the model's context)"
    )
    vocab_size: int | None = setting(
        None,
        "language models: vocabulary (default: the token shards' manifest, or 257 "
        "byte-level tokens with synthetic data)",
    )

    @property
    def language_model(self) -> bool:
        return self.model in LM_MODELS

    def check_model(self) -> None:
        """The model and its shape, then the plug-ins' form (importing them needs torch) and the
        weights a run starts from."""
        check_choice_or_plugin("model", self.model, MODELS)
        check_int_range("num_classes", self.num_classes, 2, 1_000_000)
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
        self._check_hooks()
        if self.init_from:
            init_source(self.init_from)

    def _check_hooks(self) -> None:
        for name in ("loss", "metric"):
            if ref := getattr(self, name):
                check_plugin_ref(name, ref)
                if self.language_model:
                    raise ConfigError(
                        f"{name}={ref}: {self.model} trains on next-token cross-entropy; delete "
                        "the setting"
                    )
        check_plugin_args("model_args", self.model_args, "model", self.model)
