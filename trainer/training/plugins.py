"""A team's own model, data, loss and metric, plugged into the trainer by ``pkg.module:name``
and checked once, before any worker starts, in one ``PluginError`` line naming the plug-in and
what was expected. The interface: docs/trainer.md, "Run your own model"."""

from __future__ import annotations

import contextlib
import importlib
import io
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset, default_collate

from trainer.common.errors import ConfigError, first_line
from trainer.settings.choices import is_plugin_ref
from trainer.settings.train_config import TrainConfig

Hook = Callable[[Any, torch.Tensor], torch.Tensor]


class PluginError(ConfigError):
    """A plug-in cannot be used; the message is one line naming it and what was expected."""


def resolve(setting: str, ref: str) -> Callable[..., Any]:
    """The callable ``ref`` (``pkg.module:name``, ``name`` may be dotted) names."""
    module_name, _, attribute = ref.partition(":")
    _working_directory_first()
    try:
        target: Any = _held_stderr(setting, ref, "module", importlib.import_module, module_name)
    except PluginError:
        raise
    except Exception as err:
        # ImportError, or whatever the module raises while it is imported.
        raise PluginError(
            f"{setting}={ref}: cannot import {module_name} ({type(err).__name__}: "
            f"{first_line(err)}{_wrote(err)}); run from the folder holding the package or put "
            "it on PYTHONPATH"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise PluginError(f"{setting}={ref}: {module_name} has no {attribute}")
        target = getattr(target, part)
    if not callable(target):
        raise PluginError(
            f"{setting}={ref}: {attribute} is a {type(target).__name__}, not a function"
        )
    return target


def _working_directory_first() -> None:
    """``python -m trainer`` imports from the working directory (``sys.path[0]``); the
    ``dt-train`` console script starts with its own bin folder there instead. Both import a
    team's package from the folder they run in, as the error below tells them to."""
    here = os.getcwd()
    if not any(entry in ("", here) for entry in sys.path):
        sys.path.insert(0, here)


def _held_stderr(
    setting: str, ref: str, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """``fn(*args, **kwargs)`` with what it writes on stderr held back until it returned, so a
    failure is one line: a ``SystemExit`` (not an ``Exception``: sys.exit, or argparse reading
    sys.argv, which prints its usage there first) becomes a PluginError naming ``what``; an
    exception carries the last line it wrote (``_wrote``) to the caller's one line."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            made = fn(*args, **kwargs)
    except SystemExit as err:
        last = _last_line(said)
        why = first_line(err) if not isinstance(err.code, int) else f"{err.code}"
        raise PluginError(
            f"{setting}={ref}: the {what} exited (SystemExit: {why}{'; ' + last if last else ''}"
            f"); a plug-in's {what} returns and reads no command line: take settings as "
            "keyword arguments (--model-args/--data-args)"
        ) from None
    except Exception as err:
        if last := _last_line(said):
            err.add_note(WROTE + last)
        raise
    sys.stderr.write(said.getvalue())
    return made


WROTE = "it wrote: "


def _last_line(said: io.StringIO) -> str:
    return next((line for line in reversed(said.getvalue().splitlines()) if line.strip()), "")


def _wrote(err: BaseException) -> str:
    """ "; it wrote: <its last stderr line>" when ``_held_stderr`` kept one, else ""."""
    notes = [n for n in getattr(err, "__notes__", ()) if n.startswith(WROTE)]
    return f"; {notes[-1].strip()}" if notes else ""


def _call(setting: str, ref: str, factory: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return _held_stderr(setting, ref, "factory", factory, *args, **kwargs)
    except PluginError:
        raise
    except Exception as err:
        raise PluginError(
            f"{setting}={ref}: the factory raised {type(err).__name__}: {first_line(err)}"
            f"{_wrote(err)}"
        ) from None


@dataclass(frozen=True)
class PluginData:
    """The data plug-in's datasets: every item an ``(input, target)`` pair."""

    train: Dataset[Any]
    val: Dataset[Any] | None


@dataclass(frozen=True)
class Objective:
    """What a step minimises and counts: ``loss(outputs, targets)``, the batch's mean loss;
    ``correct(outputs, targets)``, how many of its samples are right (None: not measured);
    ``count(targets)``, how many samples the batch holds."""

    loss: Hook
    correct: Hook | None
    count: Callable[[torch.Tensor], int]


def classification(label_smoothing: float, per_element: bool) -> Objective:
    """Cross-entropy over class scores ``[..., classes]`` and top-1 accuracy. ``per_element``:
    every target element is a sample (a language model's tokens); otherwise the batch's rows."""
    criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return criterion(outputs.flatten(0, -2), targets.flatten())

    def correct(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.detach().argmax(dim=-1) == targets).sum()

    count: Callable[[torch.Tensor], int] = (lambda t: t.numel()) if per_element else len
    return Objective(loss, correct, count)


@dataclass(frozen=True)
class Plugins:
    """The resolved plug-ins of a config (None: the built-in one) and the data plug-in's
    datasets, built once."""

    model: Callable[..., Any] | None = None
    data: PluginData | None = None
    loss: Hook | None = None
    metric: Hook | None = None

    def build_model(self, cfg: TrainConfig, outputs: int) -> nn.Module:
        """The model: the plug-in's (checked by ``load``) or a built-in one."""
        from trainer.models.build import build_model

        if self.model is None:
            return build_model(cfg.model, outputs)
        return _model(cfg, self.model)

    def objective(self, cfg: TrainConfig) -> Objective:
        default = classification(cfg.label_smoothing, per_element=self.data is None)
        if self.loss is None:
            return default if self.metric is None else Objective(default.loss, self.metric, len)
        return Objective(self.loss, self.metric, len)


def load(cfg: TrainConfig) -> tuple[Plugins, int | None]:
    """Every plug-in of ``cfg`` imported, called and checked against the others on one sample
    (``PluginError`` when one does not fit), and the number of parameters of the model this
    built to check them (None without plug-ins: nothing of a team's to check)."""
    refs = {name: getattr(cfg, name) for name in ("model", "data", "loss", "metric")}
    found = {k: resolve(k, v) for k, v in refs.items() if v and is_plugin_ref(v)}
    if not found:
        return Plugins(), None
    data = None
    if "data" in found:
        made = _call("data", cfg.data, found["data"], cfg, **cfg.data_args)
        data = _check_data(cfg.data, made)
    plugins = Plugins(found.get("model"), data, found.get("loss"), found.get("metric"))
    model = plugins.build_model(cfg, cfg.num_classes)
    _check_units(cfg.model, model)
    _check_step(cfg, plugins, model)
    return plugins, sum(p.numel() for p in model.parameters())


def _model(cfg: TrainConfig, factory: Callable[..., Any]) -> nn.Module:
    model = _call("model", cfg.model, factory, cfg, **cfg.model_args)
    if not isinstance(model, nn.Module):
        raise PluginError(
            f"model={cfg.model}: the factory returned a {type(model).__name__}; expected a "
            "torch.nn.Module"
        )
    return model


def _check_data(ref: str, made: Any) -> PluginData:
    """The factory's result as datasets, each of ``(input, target)`` samples of one shape."""
    if isinstance(made, tuple) and len(made) == 2:
        train, val = made
    else:
        train, val = made, None
    _check_dataset(ref, "train", train)
    first = _sample(ref, "train", train)
    if val is not None:
        _check_dataset(ref, "val", val)
        other = _sample(ref, "val", val)
        if [t.shape[1:] for t in other] != [t.shape[1:] for t in first]:
            raise PluginError(
                f"data={ref}: val samples have shapes {_shapes(other)} but train samples "
                f"{_shapes(first)}; expected the same"
            )
    return PluginData(train, val)


def _check_dataset(ref: str, split: str, dataset: Any) -> None:
    expected = "expected a map-style torch.utils.data.Dataset (or a (train, val) pair)"
    if isinstance(dataset, IterableDataset) or not (
        hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
    ):
        kind = type(dataset).__name__
        raise PluginError(f"data={ref}: the {split} set is a {kind}; {expected}")
    try:
        size = len(dataset)
    except Exception as err:
        raise PluginError(
            f"data={ref}: len() of the {split} set raised {type(err).__name__}: {first_line(err)}"
        ) from None
    if size < 1:
        raise PluginError(f"data={ref}: the {split} set is empty; expected at least one sample")


def _sample(ref: str, split: str, dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample 0 of ``dataset`` collated into a batch of one: (inputs, targets)."""
    try:
        item = dataset[0]
    except Exception as err:
        raise PluginError(
            f"data={ref}: {split}[0] raised {type(err).__name__}: {first_line(err)}"
        ) from None
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise PluginError(
            f"data={ref}: {split}[0] is a {type(item).__name__}"
            f"{f' of {len(item)}' if isinstance(item, (tuple, list)) else ''}; expected an "
            "(input, target) pair of tensors"
        )
    for name, value in zip(("input", "target"), item, strict=True):
        if not isinstance(value, (torch.Tensor, int, float)):
            raise PluginError(
                f"data={ref}: the {name} of {split}[0] is a {type(value).__name__}; expected "
                "a tensor (or a number)"
            )
    inputs, targets = default_collate([tuple(item)])
    return inputs, targets


def _shapes(batch: tuple[torch.Tensor, torch.Tensor]) -> str:
    return " and ".join(str(list(t.shape[1:])) for t in batch)


def _check_units(ref: str, model: nn.Module) -> None:
    """A declared ``sharding_units`` names the model's own submodules."""
    from trainer.models.build import sharding_units

    try:
        units = sharding_units(model)
    except Exception as err:
        raise PluginError(
            f"model={ref}: its sharding_units raised {type(err).__name__}: {first_line(err)}"
        ) from None
    own = {id(m) for m in model.modules() if m is not model}
    if any(not isinstance(u, nn.Module) or id(u) not in own for u in units):
        raise PluginError(
            f"model={ref}: sharding_units must list submodules of the model (the blocks FSDP "
            "shards one by one)"
        )


def _check_step(cfg: TrainConfig, plugins: Plugins, model: nn.Module) -> None:
    """The model's forward on one sample of the data, and the loss and metric on its output."""
    if plugins.data is not None:
        inputs, targets = _sample(cfg.data, "train", plugins.data.train)
        where = f"one sample of data={cfg.data} (input {list(inputs.shape)})"
    else:  # the built-in synthetic images and labels
        inputs = torch.zeros(1, 3, cfg.image_size, cfg.image_size)
        targets = torch.zeros(1, dtype=torch.long)
        where = f"one image of data={cfg.data} ({list(inputs.shape)})"
    model.eval()  # BatchNorm's statistics stay as built
    with torch.no_grad():
        try:
            outputs = model(inputs)
        except Exception as err:
            raise PluginError(
                f"model={cfg.model}: its forward on {where} raised {type(err).__name__}: "
                f"{first_line(err)}; expected the model to take a batch of the data's inputs"
            ) from None
        objective = plugins.objective(cfg)
        hooks = (("loss", cfg.loss, objective.loss), ("metric", cfg.metric, objective.correct))
        for name, ref, hook in hooks:
            if hook is None:
                continue
            shown = f"{name}={ref}" if ref else f"the default {name} (classification)"
            try:
                value = hook(outputs, targets)
            except Exception as err:
                raise PluginError(
                    f"{shown}: on the model's outputs {_shape(outputs)} and the targets "
                    f"{list(targets.shape)} it raised {type(err).__name__}: {first_line(err)}; "
                    "give --loss/--metric pkg.module:function for such outputs"
                ) from None
            # The loss is differentiated as it is: a scalar; a count may have any one-element
            # shape.
            scalar = isinstance(value, torch.Tensor) and (value.dim() == 0 or name == "metric")
            if not scalar or value.numel() != 1:
                raise PluginError(f"{shown}: returned {_shape(value)}; expected a scalar tensor")
            if name == "loss" and not math.isfinite(float(value)):
                raise PluginError(
                    f"{shown}: returned {float(value)} on one sample; expected a finite loss"
                )


def _shape(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {list(value.shape)}"
    return f"a {type(value).__name__}"
