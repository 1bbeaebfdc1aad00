"""A job's trainer settings: its YAML file, read and validated by the trainer once when the
stack's settings load (``infra.config``), and the one function that turns them into the flags
the job passes to ``python -m trainer``. The file chooses the engine (``backend``): horovod
(the job's default), or a torch.distributed one (ddp, fsdp), which the node launcher starts the
torchrun way; ``local`` cannot use a pool's nodes and is refused."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra.batch import DEFAULT_BACKEND
from trainer.cli import to_flags
from trainer.config import TORCH_DISTRIBUTED_BACKENDS, TrainConfig
from trainer.config import ConfigError as TrainerConfigError

# Settings the job gives the trainer itself (infra/batch.py): the run folder on the shared mount;
# with a staged dataset also its source and folder.
JOB_OWNED = ("output_dir",)
STAGED_DATA_OWNED = ("data", "data_dir")
# The engines a job can train on: those the node launcher (trainer.launch) starts on every node.
JOB_BACKENDS = (DEFAULT_BACKEND, *TORCH_DISTRIBUTED_BACKENDS)


class TrainerSettingsError(ValueError):
    """The file cannot be read or the trainer refuses it; ``infra.config`` names the key."""


@dataclass(frozen=True)
class TrainerSettings:
    path: str  # as the stack gives it, relative to the repository
    # The file's settings in the file's order: the job's flags follow it, and a job's id hashes
    # its flags, so they must not change when the trainer's defaults do.
    values: Mapping[str, Any] = field(hash=False)
    config: TrainConfig  # the same settings as the trainer validated them

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


def job_values(settings: TrainerSettings, dataset_prefix: str = "") -> dict[str, Any]:
    """The file's settings less those the job sets itself (``JOB_OWNED``, and
    ``STAGED_DATA_OWNED`` when it stages ``dataset_prefix``), in the file's order. A
    ``backend`` other than the job's default stays (the job then passes it as it is); the
    default is left to the job, which names it itself (``infra.batch.trainer_command``), so a
    file that spells out ``backend: horovod`` gives the same command line, job id and run
    folder as one that does not, and as before files could choose."""
    owned = JOB_OWNED + (STAGED_DATA_OWNED if dataset_prefix else ())
    return {
        key: value
        for key, value in settings.values.items()
        if key not in owned and not (key == "backend" and value == DEFAULT_BACKEND)
    }


def trainer_flags(settings: TrainerSettings, dataset_prefix: str = "") -> tuple[str, ...]:
    """The job's ``python -m trainer`` flags (the TrainingJob's ``trainer_args``)."""
    return tuple(to_flags(job_values(settings, dataset_prefix)))
