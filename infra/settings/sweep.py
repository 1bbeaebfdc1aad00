"""A job's hyperparameter sweep (``jobs.<name>.sweep``), read and checked before anything is
created: a search space over the job's trainer settings (each candidate validated by the
trainer), an objective the trainer logs to MLflow, a sampling algorithm, a trial budget and an
early-termination policy. On the AzureML backend it is a native sweep job (infra.azureml_job).

Read 2026-11-29 (MicrosoftDocs/azure-ai-docs, articles/machine-learning/):
how-to-tune-hyperparameters.md (grid sampling takes choices only; Bayesian sampling takes
choice, uniform and quniform and no early-termination policy; the primary metric must match the
name the trial logs), reference-yaml-job-sweep.md (the policies' fields); azure-ai-ml's
search_space.py (each distribution's REST form)."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from infra.settings.checks import ConfigError
from infra.trainer_command import JOB_SET, STAGED_DATA_SET
from trainer.common.errors import ConfigError as TrainerConfigError
from trainer.settings.train_config import TrainConfig

SWEEP_KEYS = ("space", "objective", "goal", "sampling", "trials", "concurrentTrials", "stop")
# The distributions a space may give a setting, and how many numbers each takes.
DISTRIBUTIONS = {"choice": None, "uniform": 2, "loguniform": 2, "quniform": 3}
SAMPLINGS = {  # what each sampling accepts (how-to-tune-hyperparameters.md)
    "random": ("choice", "uniform", "loguniform", "quniform"),
    "grid": ("choice",),
    "bayesian": ("choice", "uniform", "quniform"),
}
# What rank 0 logs to MLflow (trainer.outputs.tracking) that a sweep can optimize, and its goal.
OBJECTIVES = {"val_loss": "minimize", "val_accuracy": "maximize", "loss": "minimize"}
POLICIES = {"bandit": "Bandit", "median": "MedianStopping", "truncation": "TruncationSelection"}
MAX_TRIALS = 1000


@dataclass(frozen=True)
class SweepSettings:
    space: tuple[tuple[str, str, tuple[Any, ...]], ...]  # (setting, distribution, its numbers)
    objective: str
    goal: str
    sampling: str
    trials: int
    concurrent_trials: int
    stop: tuple[tuple[str, Any], ...] = ()  # the early-termination policy: () for none

    @property
    def swept(self) -> tuple[str, ...]:
        return tuple(key for key, _, _ in self.space)

    def search_space(self) -> dict[str, list[Any]]:
        """The space in AzureML's REST form: [distribution, [its numbers]], a choice's values
        as one list."""
        return {
            key: [kind, [list(args)] if kind == "choice" else list(args)]
            for key, kind, args in self.space
        }

    def outputs(self) -> dict[str, Any]:
        """What the stack outputs of it, for `dt-jobs trials`: the objective, its goal, and the
        settings each trial is given."""
        return {"objective": self.objective, "goal": self.goal, "settings": list(self.swept)}

    def identity(self) -> str:
        """All of it, as the job's name hashes it (a new sweep is a new job)."""
        return json.dumps([getattr(self, f.name) for f in fields(self)])


def read_sweep(name: str, raw: Any, trainer_values: Mapping[str, Any] | None) -> SweepSettings:
    """``jobs.<name>.sweep``, checked against the job's trainer file (``trainer_values``; None:
    the job runs its own command, which has no settings to sweep)."""
    key = f"jobs.{name}.sweep"
    if trainer_values is None:
        raise ConfigError(
            f"{key}: a sweep varies the trainer's settings; give the job a trainerConfig"
        )
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}={raw!r}: give a mapping of space, objective, trials, ...")
    unknown = sorted(set(raw) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown; a sweep takes {', '.join(SWEEP_KEYS)}")
    sampling = raw.get("sampling", "random")
    if sampling not in SAMPLINGS:
        raise ConfigError(f"{key}.sampling={sampling!r}: choose {', '.join(SAMPLINGS)}")
    space = _space(key, raw.get("space"), trainer_values, sampling)
    objective = raw.get("objective")
    if objective not in OBJECTIVES:
        raise ConfigError(
            f"{key}.objective={objective!r}: the trainer logs {', '.join(OBJECTIVES)} to MLflow "
            "(val_* once per epoch, with validation data); name one of them"
        )
    goal = raw.get("goal", OBJECTIVES[objective])
    if goal not in ("minimize", "maximize"):
        raise ConfigError(f"{key}.goal={goal!r}: minimize or maximize")
    trials = _count(f"{key}.trials", raw.get("trials"), 1, MAX_TRIALS)
    concurrent = _count(f"{key}.concurrentTrials", raw.get("concurrentTrials", 1), 1, trials)
    stop = _stop(key, raw.get("stop"), sampling)
    return SweepSettings(space, objective, goal, sampling, trials, concurrent, stop)


def _count(key: str, value: Any, low: int, high: int) -> int:
    """A whole number in ``low..high`` (`pulumi config set --path` stores it as text)."""
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}={value!r}: give a whole number in {low}..{high}")
    return value


def _number(value: Any) -> Any:
    """``value`` as a number when it is one, or text of one (`pulumi config set --path` stores
    text); else as it is, for the check that names it."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value) if re.fullmatch(r"-?\d+", value.strip()) else float(value)
    return value


def _space(
    key: str, raw: Any, values: Mapping[str, Any], sampling: str
) -> tuple[tuple[str, str, tuple[Any, ...]], ...]:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(
            f"{key}.space={raw!r}: map trainer settings to a distribution, e.g. "
            "lr: {uniform: [0.01, 0.2]} or batch_size: {choice: [128, 256]}"
        )
    settings = {f.name for f in fields(TrainConfig)} - set(JOB_SET) - set(STAGED_DATA_SET)
    space = []
    for raw_setting, raw_distribution in raw.items():
        setting = str(raw_setting).replace("-", "_")
        where = f"{key}.space.{raw_setting}"
        if setting not in settings:
            raise ConfigError(f"{where}: names no trainer setting a job may set; name one")
        if isinstance(getattr(TrainConfig.from_mapping(dict(values)), setting), bool):
            raise ConfigError(f"{where}: a switch has no values to sweep; sweep it as two jobs")
        kind, args = _distribution(where, raw_distribution)
        if kind not in SAMPLINGS[sampling]:
            raise ConfigError(
                f"{where}: {sampling} sampling takes {', '.join(SAMPLINGS[sampling])}, not {kind}"
            )
        for candidate in _candidates(kind, args):
            _check_value(where, values, setting, candidate)
        space.append((setting, kind, args))
    return tuple(space)


def _distribution(where: str, raw: Any) -> tuple[str, tuple[Any, ...]]:
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in DISTRIBUTIONS:
        raise ConfigError(
            f"{where}={raw!r}: give one of {', '.join(DISTRIBUTIONS)} with its values, e.g. "
            "{choice: [128, 256]} or {uniform: [0.01, 0.2]}"
        )
    ((kind, args),) = raw.items()
    args = [_number(a) for a in args] if isinstance(args, list) else args
    size = DISTRIBUTIONS[kind]
    numbers = all(isinstance(a, int | float) and not isinstance(a, bool) for a in args or [0])
    if not isinstance(args, list) or not args or (size is not None and len(args) != size):
        wanted = "one value or more" if size is None else f"{size} numbers"
        raise ConfigError(f"{where}.{kind}={args!r}: give a list of {wanted}")
    if size is not None and (not numbers or args[0] >= args[1]):
        raise ConfigError(f"{where}.{kind}={args!r}: give numbers, the lower bound first")
    return kind, tuple(args)


def _candidates(kind: str, args: tuple[Any, ...]) -> list[Any]:
    """The values the trainer must take: a choice's, a range's bounds (a loguniform's are of
    the value's natural log: AzureML samples exp(uniform(low, high)))."""
    if kind == "choice":
        return list(args)
    return [math.exp(a) for a in args[:2]] if kind == "loguniform" else list(args[:2])


def _check_value(where: str, values: Mapping[str, Any], setting: str, value: Any) -> None:
    """The trainer takes ``value`` for ``setting`` beside the file's other settings."""
    try:
        TrainConfig.from_mapping({**values, setting: value})
    except TrainerConfigError as err:
        raise ConfigError(f"{where}: {value!r} is refused by the trainer ({err})") from None


def _stop(key: str, raw: Any, sampling: str) -> tuple[tuple[str, Any], ...]:
    """The early-termination policy, as (field, value) pairs AzureML takes."""
    if raw is None:
        return ()
    if sampling == "bayesian":
        raise ConfigError(f"{key}.stop: Bayesian sampling takes no early termination; remove it")
    if not isinstance(raw, dict) or raw.get("policy") not in POLICIES:
        raise ConfigError(f"{key}.stop={raw!r}: give policy: {', '.join(POLICIES)}")
    policy = raw["policy"]
    allowed = {"policy", "evaluationInterval", "delayEvaluation"}
    allowed |= {
        "bandit": {"slackFactor", "slackAmount"},
        "truncation": {"truncationPercentage"},
    }.get(policy, set())
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{key}.stop.{unknown[0]}: not a field of the {policy} policy")
    pairs: list[tuple[str, Any]] = [("policyType", POLICIES[policy])]
    pairs.append(
        (
            "evaluationInterval",
            _count(f"{key}.stop.evaluationInterval", raw.get("evaluationInterval", 1), 1, 1000),
        )
    )
    pairs.append(
        (
            "delayEvaluation",
            _count(f"{key}.stop.delayEvaluation", raw.get("delayEvaluation", 0), 0, 1000),
        )
    )
    if policy == "bandit":
        given = [k for k in ("slackFactor", "slackAmount") if k in raw]
        slack = _number(raw[given[0]]) if len(given) == 1 else None
        if not isinstance(slack, int | float) or isinstance(slack, bool) or slack <= 0:
            raise ConfigError(
                f"{key}.stop: the bandit policy takes one of slackFactor or slackAmount, above 0"
            )
        pairs.append((given[0], float(slack)))
    if policy == "truncation":
        percent = _count(f"{key}.stop.truncationPercentage", raw.get("truncationPercentage"), 1, 99)
        pairs.append(("truncationPercentage", percent))
    return tuple(pairs)
