"""A job's trainer settings: its YAML file, read and validated by the trainer once when the
stack's settings load (``infra.settings.jobs``); what the job passes on is those validated
settings as data (``job_settings``: ``infra.trainer_command.JobTrainer``), from which its flags
are rendered. The file chooses the engine
(``backend``): horovod (the job's default) or a torch.distributed one (ddp, fsdp); ``local``
cannot use a pool's nodes and is refused."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra.trainer_command import DEFAULT_BACKEND, JOB_BACKENDS, JobTrainer, job_trainer
from trainer.common.errors import ConfigError as TrainerConfigError
from trainer.settings.train_config import TrainConfig

__all__ = ["JOB_BACKENDS", "TrainerSettings", "TrainerSettingsError", "job_settings"]


class TrainerSettingsError(ValueError):
    """The file cannot be read or the trainer refuses it; ``infra.settings.jobs`` names the key."""


@dataclass(frozen=True)
class TrainerSettings:
    path: str  # as the stack gives it, relative to the repository
    # The file's settings in the file's order: the job's flags follow it (and its spelling of a
    # value, where the trainer reads it back the same), and a job's id hashes its flags, so they
    # must not change when the trainer's defaults do.
    values: Mapping[str, Any] = field(hash=False)
    config: TrainConfig  # the same settings as the trainer validated them: the flags' values

    @classmethod
    def read(cls, path: str, root: Path) -> TrainerSettings:
        try:
            values = yaml.safe_load((root / path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise TrainerSettingsError(f"cannot read ({err})") from None
        except UnicodeDecodeError as err:
            raise TrainerSettingsError(
                f"not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
                "save it as UTF-8 (for example iconv -f latin1 -t utf-8)"
            ) from None
        except (ValueError, RecursionError) as err:
            # A NUL byte in the path, a date YAML cannot build (2026-02-30), deep nesting.
            raise TrainerSettingsError(f"cannot read ({err or 'nested too deeply'})") from None
        if not isinstance(values, dict):
            raise TrainerSettingsError("must be a mapping")
        try:
            config = TrainConfig.from_mapping(values)
        except TrainerConfigError as err:
            raise TrainerSettingsError(str(err)) from None
        if config.backend not in JOB_BACKENDS:
            raise TrainerSettingsError(
                f"backend={config.backend}: a job trains on the pool's nodes, and the node "
                f"launcher starts {', '.join(JOB_BACKENDS)}; set backend to one of them (or "
                f"delete it: {DEFAULT_BACKEND})"
            )
        return cls(path, values, config)


def job_settings(settings: TrainerSettings, dataset_prefix: str = "") -> JobTrainer:
    """The job's own trainer settings (the TrainingJob's ``trainer_settings``, which render its
    ``trainer_args``): the file's settings as the trainer validated them, less those the job
    sets itself."""
    return job_trainer(settings.values, settings.config, staged=bool(dataset_prefix))
