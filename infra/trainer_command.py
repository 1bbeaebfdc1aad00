"""What a job gives ``python -m trainer`` and its launcher: which trainer settings the job sets
itself (``JOB_SET``), the job's own validated trainer settings as data (``JobTrainer``, and the
flags they render, its ``trainer_args``), and the trainer's and the launcher's command lines,
rendered once from those settings and the job-set ones; or, for a job that runs its own command
(``script_argv``), that command and the launcher's flags for it (``script_commands``). Nothing
here reads a rendered command line back. Pure: no Azure SDK, no torch (the job provider's host
imports it).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.common.errors import ConfigError as TrainerConfigError
from trainer.launch.node_sizes import SIZES, preflight_floor
from trainer.settings.choices import TORCH_DISTRIBUTED_BACKENDS
from trainer.settings.flags import to_flags
from trainer.settings.train_config import TrainConfig

# The engine of a job whose trainer settings choose none (``trainer_args`` then carry no
# --backend): Horovod, the engine every job ran before the settings could choose one, so such a
# job's command line, id and run folder stay what they were.
DEFAULT_BACKEND = "horovod"
# The engines a job can train on: those the node launcher (trainer.launch) starts on every node.
JOB_BACKENDS = (DEFAULT_BACKEND, *TORCH_DISTRIBUTED_BACKENDS)
# The settings the job sets itself; a trainer file's own value of one is left out of the job's
# flags (the run folder on the shared mount, where rank 0 uploads its live metrics and results,
# and where it mirrors the run's checkpoints).
JOB_SET = ("output_dir", "metrics_upload_url", "outputs_url", "checkpoint_mirror_url")
# With a staged dataset, also its source and folder.
STAGED_DATA_SET = ("data", "data_dir")
# How a job's own command's workers meet (the launcher's --backend for it): torch gives every
# worker the variables torchrun would (torch.distributed, Accelerate, Lightning), horovod those
# horovodrun --gloo would (a Horovod script).
SCRIPT_ENGINES = ("torch", "horovod")
DEFAULT_SCRIPT_ENGINE = "torch"


def script_argv(value: Any) -> tuple[str, ...]:
    """A job's own command as the words its workers run: a list of strings as it is, or one
    string split as a POSIX shell splits words (``shlex.split``: quotes group, nothing is
    expanded or run by a shell). Raises ValueError naming the fix."""
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as err:
            raise ValueError(f"cannot split it into words ({err}); close the quote") from None
    elif isinstance(value, list | tuple) and all(isinstance(word, str) for word in value):
        words = list(value)
    else:
        raise ValueError("give a list of strings or one string (python train.py --epochs 3)")
    if not words or not words[0]:
        raise ValueError("empty; give the program and its arguments (python train.py ...)")
    return tuple(words)


# A job's own trainer settings as data (the TrainingJob's ``trainer_settings``): (setting, value)
# pairs in the file's order, each value spelled as its flag carries it (text, or a switch's
# bool), so that they cross Pulumi's engine unchanged (it makes every number a float and keeps
# no order of a map's keys) and render the job's flags (its ``trainer_args``) exactly.
JobTrainer = tuple[tuple[str, str | bool], ...]


def job_trainer(values: Mapping[str, Any], config: TrainConfig, staged: bool) -> JobTrainer:
    """The file's settings the job passes on (``values``, in the file's order, less ``JOB_SET``,
    ``STAGED_DATA_SET`` when ``staged``, and the default engine), each as the trainer validated
    it (``config``) and spelled so that the trainer reads it back as that (``_spelled``). A
    setting whose flag renders nothing (None, an empty mapping) is left out, as from the flags."""
    left_out = JOB_SET + (STAGED_DATA_SET if staged else ())
    passed: list[tuple[str, str | bool]] = []
    for raw_key, raw in values.items():
        key = str(raw_key).replace("-", "_")
        if key in left_out or (key == "backend" and config.backend == DEFAULT_BACKEND):
            continue
        spelled = _spelled(key, raw, getattr(config, key))
        if spelled is not None:
            passed.append((key, spelled))
    return tuple(passed)


def _spelled(key: str, raw: Any, validated: Any) -> str | bool | None:
    """``validated`` as a flag's value: the file's own spelling when the trainer reads it back
    as ``validated`` (so ``lr: 1e-3`` stays ``1e-3``: a job's id and run folder hash its flags),
    else the validated value's (``pin_memory: "off"`` is ``--no-pin-memory``); None when the
    flag would render nothing."""
    if isinstance(validated, bool) or validated is None:
        return validated
    text = ",".join(str(v) for v in raw) if isinstance(raw, list | tuple) else str(raw)
    try:
        if getattr(TrainConfig.from_mapping({key: text}), key) == validated:
            return text
    except TrainerConfigError:
        pass
    if isinstance(validated, dict):  # the flag carries the mapping as JSON (to_flags)
        return json.dumps(validated, sort_keys=True) if validated else None
    return ",".join(str(v) for v in validated) if isinstance(validated, tuple) else str(validated)


def trainer_flags(settings: JobTrainer) -> tuple[str, ...]:
    """The ``python -m trainer`` flags of a job's own settings (the TrainingJob's
    ``trainer_args``, which its id and run folder hash)."""
    return tuple(to_flags(dict(settings)))


def with_settings(settings: JobTrainer, **changed: str | None) -> JobTrainer:
    """``settings`` with each of ``changed`` set to its value (None: left out), at the end."""
    kept = [(key, value) for key, value in settings if key not in changed]
    return (*kept, *((key, value) for key, value in changed.items() if value is not None))


@dataclass(frozen=True)
class JobSet:
    """The values of the settings a job sets itself, from the job's fields (``infra.batch``)."""

    run_dir: str  # the run folder on the shared mount, as the node names it
    metrics_upload_url: str
    outputs_url: str
    vm_size: str
    dataset_dir: str = ""  # the staged dataset's folder on the node; "" when none is staged
    checkpoint_mirror_url: str = ""  # where rank 0 mirrors the run's checkpoints; "": off

    def values(self, own: Mapping[str, Any]) -> dict[str, Any]:
        """The job-set settings for a job whose own settings are ``own``, none of which those
        hold, in the command line's order."""
        given: dict[str, Any] = {}
        if "backend" not in own:
            given["backend"] = DEFAULT_BACKEND
        if self.dataset_dir:
            given.update(data="shards", data_dir=self.dataset_dir)
        given.update(
            output_dir=self.run_dir,
            metrics_upload_url=self.metrics_upload_url,
            outputs_url=self.outputs_url,
        )
        if self.checkpoint_mirror_url:
            given["checkpoint_mirror_url"] = self.checkpoint_mirror_url
        # None on a size without InfiniBand (the CPU acceptance size): there is no baseline to
        # hold it to; nor on a size this version does not know (an older stack's), which the
        # launcher refuses on the node with a one-line error.
        floor = preflight_floor(self.vm_size) if self.vm_size in SIZES else 0.0
        if floor > 0 and "preflight_min_busbw" not in own:
            given["preflight_min_busbw"] = floor
        return given


def commands(settings: JobTrainer, job: JobSet) -> tuple[list[str], list[str]]:
    """(the trainer's complete command, the launcher's flags), from the job's own settings and
    the job-set ones. The launcher is told the engine and the run folder; it never reads the
    trainer's command."""
    own = dict(settings)
    given = job.values(own)
    trainer = ["python", "-m", "trainer", *to_flags(own), *to_flags(given)]
    engine = str(own.get("backend", given.get("backend")))
    return trainer, ["--backend", engine, "--run-dir", given["output_dir"]]


def script_commands(
    command: Sequence[str], engine: str, job: JobSet
) -> tuple[list[str], list[str]]:
    """(the job's own command as its workers run it, the launcher's flags): the engine, the run
    folder (each worker's DT_RUN_DIR) and where the master copies the run folder's
    metrics.jsonl and tensorboard/ while it runs (the trainer does that itself)."""
    if engine not in SCRIPT_ENGINES:
        raise ValueError(f"engine={engine!r}: not one of {', '.join(SCRIPT_ENGINES)}")
    launcher = ["--backend", engine, "--run-dir", job.run_dir]
    return list(command), [*launcher, "--metrics-upload-url", job.metrics_upload_url]


def stage_data_command(account_url: str, prefix: str, dest: str) -> list[str]:
    """``dt-data stage`` of the datasets container's ``prefix`` into ``dest`` on a node
    (``trainer.data.transfer.stage_args`` builds the same; importing it here would import torch
    through ``trainer.data``)."""
    stage = ["python", "-m", "trainer.data", "stage", "--account-url", account_url]
    return [*stage, "--container", "datasets", "--prefix", prefix, "--dest", dest]
