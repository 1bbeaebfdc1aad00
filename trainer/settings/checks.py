"""The checks a trainer setting's value goes through, each failing in one line that names the
setting, the value and what would be valid: choices, ranges, plug-in references and their
arguments, an ``--init-from`` source, a profiler window, and a YAML or flag value coerced to its
field's type."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import ConfigError
from trainer.common.values import interval, shown, within
from trainer.settings.choices import PLUGIN_EXAMPLE, PLUGIN_REF, is_plugin_ref

# ---------------------------------------------------------------------- helpers
# A registered model's version in MLflow's registry: models:/<name>/<version> or @<alias>.
MODEL_URI = re.compile(r"^models:/[A-Za-z0-9][A-Za-z0-9._-]*(/[0-9]+|@[A-Za-z0-9_-]+)$")


def registered_model(text: str) -> bool:
    """Whether ``init_from`` names a registered model (``models:/...``); ConfigError for a
    models: URI of another form."""
    if not text.startswith("models:"):
        return False
    if not MODEL_URI.match(text):
        raise ConfigError(
            f"init_from={shown(text, 80)}: give a registered model's version as "
            "models:/<name>/<version> or models:/<name>@<alias>"
        )
    return True


def init_source(text: str) -> BlobFolder | None:
    """``init_from`` as a Blob location (an https URL: the folder's ``prefix`` ends with the
    blob's or the folder's name), or None for a local path or a registered model;
    ConfigError for anything else."""
    if registered_model(text) or "://" not in text:
        return None
    try:
        location = BlobFolder.parse(text)
    except ValueError as err:
        raise ConfigError(
            f"init_from={shown(text, 80)}: {err} (or give a local file or folder)"
        ) from None
    if not location.prefix:
        raise ConfigError(
            f"init_from={shown(text, 80)}: names a container, not a blob; give the URL of a "
            "weights file or checkpoint folder in it"
        )
    return location


def check_plugin_ref(name: str, value: str) -> None:
    if not PLUGIN_REF.match(value):
        raise ConfigError(
            f"{name}={shown(value)}: a plug-in is pkg.module:function (for example "
            f"{PLUGIN_EXAMPLE})"
        )


def check_plugin_args(name: str, args: Any, owner: str, owner_value: str) -> None:
    """A plug-in's keyword arguments: a mapping, given only to a plug-in."""
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise ConfigError(f"{name}={shown(args)}: expected a mapping of keyword arguments")
    if args and not is_plugin_ref(owner_value):
        raise ConfigError(
            f"{name}={shown(args)}: only a plug-in {owner} (pkg.module:factory) takes "
            "arguments; delete the setting"
        )


def check_choice_or_plugin(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if is_plugin_ref(value):
        check_plugin_ref(name, value)
    elif value not in choices:
        raise ConfigError(
            f"{name}={shown(value)}: must be one of {', '.join(choices)}, or a plug-in "
            f"pkg.module:factory"
        )


def profile_window(text: str) -> tuple[int, int]:
    """``profile_steps`` as (first, last): the optimizer steps a trace records, counted like
    ``--max-steps`` (from 1, over every invocation of the run)."""
    match = re.fullmatch(r"\s*(\d{1,12})\s*-\s*(\d{1,12})\s*", text)
    if match is None or not 0 < int(match[1]) <= int(match[2]):
        raise ConfigError(
            f"profile_steps={shown(text)}: give the first and last step to record as A-B with "
            "0 < A <= B (for example 20-25)"
        )
    return int(match[1]), int(match[2])


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={shown(value)}: must be one of {', '.join(choices)}")


def check_int_range(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}={shown(value)}: must be an integer in {low}..{high}")
    if not low <= value <= high:
        raise ConfigError(f"{name}={shown(value)}: must be in {low}..{high}")


def check_float_range(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    ends = {"low_open": low_open, "high_open": high_open}
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(
            f"{name}={shown(value)}: must be a number in {interval(low, high, **ends)}"
        )
    if not within(value, low, high, **ends):
        shown_value = f"{value:g}" if isinstance(value, float) else shown(value)
        raise ConfigError(f"{name}={shown_value}: must be in {interval(low, high, **ends)}")


def coerce(key: str, value: Any, annotation: Any) -> Any:
    """Turn YAML or command-line values into the field's type; raise ConfigError if impossible."""
    kind = str(annotation)
    if value is None:
        if "None" in kind:
            return None
        raise ConfigError(f"{key}=null: a value is required")
    try:
        if kind.startswith("tuple"):
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(int(str(v).strip()) for v in items if str(v).strip())
        if kind == "bool":
            return to_bool(key, value)
        if kind.startswith("dict"):
            return to_mapping(key, value)
        if kind.startswith("int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        return str(value) if kind.startswith("str") else value
    except ConfigError:
        raise
    except (TypeError, ValueError, OverflowError):
        expected = {"tuple": "integers, comma-separated", "int": "an integer", "float": "a number"}
        expected_text = next((v for k, v in expected.items() if kind.startswith(k)), kind)
        raise ConfigError(f"{key}={shown(value)}: expected {expected_text}") from None


def to_mapping(key: str, value: Any) -> dict[str, Any]:
    """A mapping from YAML, or from a flag's YAML flow text (``'{width: 32}'``)."""
    parsed = value
    if isinstance(value, str):
        try:
            parsed = yaml.safe_load(value) if value.strip() else {}
        except yaml.YAMLError:
            raise ConfigError(
                f"{key}={shown(value)}: not valid YAML; give a mapping like '{{width: 32}}'"
            ) from None
    if not isinstance(parsed, Mapping):
        raise ConfigError(f"{key}={shown(value)}: expected a mapping like {{width: 32}}")
    return dict(parsed)


def to_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ConfigError(f"{key}={value!r}: expected true or false")
