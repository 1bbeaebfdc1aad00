"""The trainer's settings: one frozen dataclass, every section of ``trainer.settings.sections``
flat, validated once, before anything runs.

Each section declares its fields, their defaults and help, and checks them; the rules across
sections are here. A YAML file (``--config``) and the command line both end up in
``TrainConfig.from_mapping``; a bad value raises ``ConfigError`` with one line naming the setting,
the value and what would be valid. The batch sizes the settings sum to over the workers
(``global_batch``, ``global_micro_batch``) are computed here, once.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer.common.errors import ConfigError
from trainer.common.values import hashable, shown
from trainer.settings.checks import check_choice_or_plugin, coerce
from trainer.settings.choices import DATA_SOURCES, LM_DATA, LM_MODELS, REMOVED_SETTINGS
from trainer.settings.sections.data import DataSettings
from trainer.settings.sections.engine import EngineSettings
from trainer.settings.sections.model import ModelSettings
from trainer.settings.sections.outputs import OutputSettings, UploadSettings
from trainer.settings.sections.schedule import ScheduleSettings
from trainer.settings.sections.watch import DiagnosisSettings, WatchSettings


# A dataclass takes its bases' fields from the last base to the first: the sections are listed
# in reverse, so the flat fields keep the order they have always had (model first). That order is
# released: a run folder's name hashes the flags in it (``to_flags``), YAML files follow it.
@dataclass(frozen=True)
class TrainConfig(
    WatchSettings,
    UploadSettings,
    DiagnosisSettings,
    OutputSettings,
    EngineSettings,
    ScheduleSettings,
    DataSettings,
    ModelSettings,
):
    """Every trainer setting, flat (``cfg.batch_size``), each section's fields in turn."""

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

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Every section's own fields and the rule across them, in a fixed order, so the first
        problem found is always the same one."""
        self.check_model()
        self._check_model_fits_data()
        self.check_data()
        self.check_schedule()
        self.check_engine()
        self.check_outputs()
        self.check_diagnosis()
        self.check_uploads()
        self.check_watch()

    def _check_model_fits_data(self) -> None:
        """A language model trains on tokens (or synthetic tokens); an image model on images.
        Checked before the rest of the data section (a folder the wrong data would need), after
        the source's own check, which this rule reads."""
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
