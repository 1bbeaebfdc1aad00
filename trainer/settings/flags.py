"""Command line -> ``TrainConfig``. Flags override ``--config FILE.yaml``, which overrides the
defaults the sections declare (``trainer.settings.sections``); each flag's help is its field's.
Errors are one line and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from trainer.common.cli import OneLineParser
from trainer.common.errors import ConfigError, first_line
from trainer.settings.declare import help_of, is_switch
from trainer.settings.train_config import FIELD_NAMES, TrainConfig

# Each setting's field: its help and whether it is a switch (--name / --no-name).
_FIELDS = {f.name: f for f in fields(TrainConfig)}
_SWITCHES = frozenset(name for name, f in _FIELDS.items() if is_switch(f))


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="dt-train",
        description="Distributed training (Horovod, DDP, FSDP or one process).",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument("--config", type=Path, help="YAML file of settings; flags override it")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=False,
        help="validate the config, build the model, print its size and exit",
    )
    for name in FIELD_NAMES:
        flag = "--" + name.replace("_", "-")
        text = help_of(_FIELDS[name])
        if name in _SWITCHES:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=text)
        else:
            parser.add_argument(flag, metavar=name.upper(), help=text)
    return parser


@dataclass(frozen=True)
class Request:
    config: TrainConfig
    dry_run: bool
    flagged: frozenset[str] = frozenset()  # the settings the flags themselves give


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"config={path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config={path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
            f"{err.start}); save it as UTF-8 (for example iconv -f latin1 -t utf-8)"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config={path}: not valid YAML{where}") from None
    except (ValueError, RecursionError) as err:
        # A value YAML parses but cannot build (a date like 2026-02-30), or nesting deeper
        # than Python's recursion limit.
        reason = first_line(err)
        raise ConfigError(f"config={path}: not a usable YAML document ({reason})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"config={path}: must be a mapping of settings, got {type(loaded).__name__}"
        )
    return loaded


def parse(argv: Sequence[str] | None = None) -> Request:
    """Parse flags and the optional YAML file; raises ConfigError, exits 2 on unknown flags."""
    namespace = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = {}
    if "config" in namespace:
        values.update(_read_yaml(namespace["config"]))
    flagged = {k: v for k, v in namespace.items() if k in FIELD_NAMES}
    values.update(flagged)
    config = TrainConfig.from_mapping(values)
    return Request(config, bool(namespace.get("dry_run")), frozenset(flagged))


def to_flags(values: dict[str, Any]) -> list[str]:
    """Settings -> the flags that reproduce them (the inverse of ``parse``), for job commands."""
    flags: list[str] = []
    for name, value in values.items():
        if name not in FIELD_NAMES:
            raise ConfigError(f"unknown setting {name!r}")
        flag = "--" + name.replace("_", "-")
        if name in _SWITCHES:
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):
            if value:  # JSON is YAML's flow style: parse() reads it back
                flags += [flag, json.dumps(value, sort_keys=True)]
        elif isinstance(value, list | tuple):
            flags += [flag, ",".join(str(v) for v in value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags
