"""The jobs' section and the jobs map: the ``jobs`` map (or the one job of submitJob/trainerConfig/
datasetPrefix) read into ``JobSettings``, each job's fields checked here, its trainer file read
and validated once, its code folder snapshot, and what it runs found in the image or that folder
(``infra.runnable``). A job against the pool and the network is a rule across sections
(``infra.settings.rules``)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.code_snapshot import REQUIREMENTS, CodeSnapshot, SnapshotError, snapshot
from infra.image_packages import REQUIREMENTS as IMAGE_PINS_FILE
from infra.image_packages import image_environment, image_pins
from infra.runnable import missing, what_runs
from infra.settings.checks import ConfigError, in_range
from infra.settings.cluster import MAX_NODES
from infra.settings.schema import setting
from infra.settings.sweep import SweepSettings, read_sweep
from infra.settings.values import REPO, typed_value
from infra.trainer_command import DEFAULT_SCRIPT_ENGINE, SCRIPT_ENGINES, script_argv
from infra.trainer_settings import TrainerSettings, TrainerSettingsError
from trainer.common.requirements import conflicts
from trainer.settings.choices import is_plugin_ref

_JOB_NAME = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,200}$")
JOB_KEYS = (
    "trainerConfig",
    "command",
    "engine",
    "code",
    "nodes",
    "datasetPrefix",
    "priority",
    "maxWallClockHours",
    "sweep",
)
# A job that has not ended a week after its creation (waiting for nodes, or wedged below what
# the watchdog sees) is stopped by Batch; a job may set its own (0: no limit).
DEFAULT_WALL_CLOCK_HOURS = 168
MAX_WALL_CLOCK_HOURS = 8760  # a year
SHORTHAND_JOB = "default"  # the one job of submitJob/trainerConfig/datasetPrefix


@dataclass(frozen=True, kw_only=True)
class JobInputs:
    """The settings the stack's jobs are read from (``job_settings``): the ``jobs`` map, or the
    one job of submitJob/trainerConfig/datasetPrefix."""

    submit_job: bool = setting(
        "submitJob",
        True,
        "Submit the training job (false stands up the environment and image only).",
    )
    trainer_config: str = setting(
        "trainerConfig",
        "trainer/presets/resnet50-cluster.yaml",
        "Trainer settings (YAML, path relative to the repository) for the job; validated before "
        "anything is created.",
    )
    dataset_prefix: str = setting(
        "datasetPrefix",
        "",
        "Folder in the datasets container with prepared shards (dt-data upload); each node "
        "stages it before training. Empty trains on what trainerConfig says.",
    )
    jobs: Mapping[str, Any] = setting(
        "jobs",
        {},
        "Named training jobs, each a Batch job on the pool - a map of name to {trainerConfig, "
        "or command (your own script: a list of words, or one string split as a POSIX shell "
        "would, never run by a shell) with engine (torch, the default: torchrun's variables; "
        "or horovod), code (a folder of the repository whose tracked files, with an optional "
        "requirements.txt, each node gets as its working directory without an image rebuild), "
        "nodes (default the pool size), datasetPrefix, priority (-1000..1000), "
        "maxWallClockHours (Batch stops the job this long after its creation; default 168, "
        "0 for none; the submitJob shorthand's job gets the default), sweep (on the AzureML "
        "backend: a hyperparameter sweep of its trainer settings, docs/azureml.md)}; "
        "set one with pulumi config set --path jobs.<name>.trainerConfig <file>. Adding or "
        "removing a job touches no other. Empty means the one job of submitJob/trainerConfig/"
        "datasetPrefix; giving both forms is an error.",
    )


@dataclass(frozen=True)
class JobSettings:
    """One training job of the stack: its trainer settings (read and validated when the stack's
    settings load) or its own command and engine, its node count, the dataset it stages and its
    Batch priority."""

    name: str
    trainer: TrainerSettings | None  # None for a job that runs its own command
    nodes: int
    dataset_prefix: str = ""
    priority: int = 0
    command: tuple[str, ...] = ()  # the job's own worker command (docs/jobs.md, Your own script)
    engine: str = ""  # how its workers meet (SCRIPT_ENGINES); "" for the trainer
    # The job's code folder as one snapshot (docs/jobs.md, Your code without an image rebuild)
    code: CodeSnapshot | None = None
    # Hours from the job's creation until Batch stops it (0: none): docs/jobs.md, Limits.
    max_wall_clock_hours: int = DEFAULT_WALL_CLOCK_HOURS
    # A hyperparameter sweep over its trainer settings (docs/azureml.md, Sweeps); None: one run.
    sweep: SweepSettings | None = None


def _read_trainer_settings(key: str, path: str) -> TrainerSettings:
    try:
        return TrainerSettings.read(path, REPO)
    except TrainerSettingsError as err:
        raise ConfigError(f"{key}={path}: {err}") from None


def job_settings(values: Mapping[str, Any], given: set[str]) -> tuple[JobSettings, ...]:
    """The stack's jobs: each entry of the ``jobs`` map, or (when the map is empty) the one job
    of ``submitJob``/``trainerConfig``/``datasetPrefix``. Giving both forms is an error."""
    jobs = values["jobs"]
    node_count = values["node_count"]
    if not jobs:
        prefix = values["dataset_prefix"]
        _check_prefix("datasetPrefix", prefix)
        if not values["submit_job"]:
            return ()
        trainer = _read_trainer_settings("trainerConfig", values["trainer_config"])
        shorthand = JobSettings(SHORTHAND_JOB, trainer, node_count, prefix)
        _check_runnable(shorthand)
        return (shorthand,)
    both = sorted(given & {"submitJob", "trainerConfig", "datasetPrefix"})
    if both:
        raise ConfigError(
            f"jobs and {both[0]} are both set: give each job's settings in the jobs map "
            f"(jobs.<name>.trainerConfig, nodes, datasetPrefix, priority) and remove {both[0]}"
        )
    return tuple(_job(name, entry, node_count) for name, entry in sorted(jobs.items()))


def _job(name: Any, entry: Any, node_count: int) -> JobSettings:
    """The entry ``name`` of the jobs map, read and checked (a job that runs what it names)."""
    if not isinstance(name, str) or not _JOB_NAME.match(name):
        raise ConfigError(
            f"jobs.{name}: a job name is 1-20 lowercase letters, digits and '-', starting "
            "with a letter (it becomes part of the Batch job id)"
        )
    if not isinstance(entry, dict):
        raise ConfigError(f"jobs.{name}={entry!r}: give a mapping with trainerConfig or command")
    unknown = sorted(set(entry) - set(JOB_KEYS))
    if unknown:
        raise ConfigError(f"jobs.{name}.{unknown[0]}: unknown; a job takes {', '.join(JOB_KEYS)}")
    nodes = typed_value(f"jobs.{name}.nodes", entry.get("nodes", node_count), {"type": "integer"})
    priority = typed_value(f"jobs.{name}.priority", entry.get("priority", 0), {"type": "integer"})
    prefix = typed_value(
        f"jobs.{name}.datasetPrefix", entry.get("datasetPrefix", ""), {"type": "string"}
    )
    in_range(f"jobs.{name}.nodes", nodes, 1, MAX_NODES)
    # Batch job priorities run from -1000 (lowest) to 1000 (highest).
    in_range(f"jobs.{name}.priority", priority, -1000, 1000)
    _check_prefix(f"jobs.{name}.datasetPrefix", prefix)
    hours = typed_value(
        f"jobs.{name}.maxWallClockHours",
        entry.get("maxWallClockHours", DEFAULT_WALL_CLOCK_HOURS),
        {"type": "integer"},
    )
    in_range(f"jobs.{name}.maxWallClockHours", hours, 0, MAX_WALL_CLOCK_HOURS)
    trainer, command, engine = _what_runs(name, entry)
    code = _code(name, entry)
    values = trainer.values if trainer is not None else None
    sweep = read_sweep(name, entry["sweep"], values) if "sweep" in entry else None
    job = JobSettings(name, trainer, nodes, prefix, priority, command, engine, code, hours, sweep)
    _check_runnable(job)
    return job


def _what_runs(
    name: str, entry: Mapping[str, Any]
) -> tuple[TrainerSettings | None, tuple[str, ...], str]:
    """(trainer settings, command, engine) of the job ``name``: its trainerConfig, or its own
    command and engine; never both."""
    if "command" in entry:
        if "trainerConfig" in entry:
            raise ConfigError(
                f"jobs.{name}: command and trainerConfig are both set: a job runs either the "
                f"trainer or your command; remove jobs.{name}.trainerConfig or "
                f"jobs.{name}.command"
            )
        return _script(name, entry)
    if "engine" in entry:
        raise ConfigError(
            f"jobs.{name}.engine={entry['engine']!r}: only a job with a command chooses its "
            f"engine (the trainer's comes from its trainerConfig's backend); remove it"
        )
    trainer_config = entry.get("trainerConfig")
    if not isinstance(trainer_config, str) or not trainer_config:
        raise ConfigError(
            f"jobs.{name}.trainerConfig: required (a trainer YAML path), or give "
            f"jobs.{name}.command"
        )
    return _read_trainer_settings(f"jobs.{name}.trainerConfig", trainer_config), (), ""


def _code(name: str, entry: Mapping[str, Any]) -> CodeSnapshot | None:
    """The snapshot of the job's code folder, built (and refused) before anything is created."""
    if "code" not in entry:
        return None
    folder = typed_value(f"jobs.{name}.code", entry["code"], {"type": "string"})
    try:
        code = snapshot(folder, REPO)
    except SnapshotError as err:
        raise ConfigError(f"jobs.{name}.code={folder!r}: {err}") from None
    requirements = code.requirements
    found = conflicts(requirements, image_pins(), image_environment()) if requirements else []
    if found:
        raise ConfigError(
            f"jobs.{name}.code={folder!r}: its {REQUIREMENTS} {found[0]} ({IMAGE_PINS_FILE} "
            "or the Dockerfile pins it); accept the image's version or drop the line: each node "
            "installs the job's requirements over the image's packages, never in place of them"
        )
    return code


def _script(name: str, entry: Mapping[str, Any]) -> tuple[None, tuple[str, ...], str]:
    """(no trainer settings, the job's command as argv, its engine)."""
    try:
        command = script_argv(entry["command"])
    except ValueError as err:
        raise ConfigError(f"jobs.{name}.command={entry['command']!r}: {err}") from None
    engine = entry.get("engine", DEFAULT_SCRIPT_ENGINE)
    if engine not in SCRIPT_ENGINES:
        raise ConfigError(
            f"jobs.{name}.engine={engine!r}: choose {' or '.join(SCRIPT_ENGINES)} (torch: "
            "torchrun's variables, for torch.distributed, Accelerate or Lightning scripts; "
            "horovod: horovodrun's, for a Horovod script)"
        )
    return None, command, engine


def _check_runnable(job: JobSettings) -> None:
    """What the job runs (its command's script or module, its trainer's plug-ins) is in the
    image or in its code folder (infra.runnable)."""
    code_files = job.code.file_names if job.code is not None else None
    where = (
        f"its code folder {job.code.folder}"
        if job.code is not None
        else "a code folder (the job has none)"
    )
    if job.command and (started := what_runs(job.command)) is not None:
        kind, name = started
        if missing(kind, name, code_files, _repo_packages()):
            raise ConfigError(
                f"jobs.{job.name}.command={shlex.join(job.command)!r}: its {kind} {name} is "
                f"neither in the image (which holds trainer/ alone) nor in {where}; set "
                f"jobs.{job.name}.code to the folder holding it and name the {kind} relative "
                "to that folder (code: examples/torchrun_ddp, command: python train.py)"
            )
    config = job.trainer.config if job.trainer is not None else None
    for plugin in ("model", "data", "loss", "metric") if config is not None else ():
        ref = getattr(config, plugin)
        module = ref.partition(":")[0] if is_plugin_ref(ref) else ""
        if module and missing("module", module, code_files, _repo_packages()):
            raise ConfigError(
                f"jobs.{job.name}: trainerConfig's {plugin}={ref}: the module is neither in "
                f"the image (which holds trainer/ alone) nor in {where}; set "
                f"jobs.{job.name}.code to the folder that holds its package"
            )


def _repo_packages() -> frozenset[str]:
    """The repository's top-level Python packages (infra.runnable)."""
    return frozenset(p.name for p in REPO.iterdir() if (p / "__init__.py").is_file())


def _check_prefix(key: str, prefix: str) -> None:
    if prefix and not _PREFIX.match(prefix):
        raise ConfigError(
            f"{key}={prefix!r}: use letters, digits, '.', '_', '-' "
            "and '/' (the folder you uploaded with dt-data upload)"
        )
