"""A stack's values read against Pulumi.yaml's ``config:`` schema: by short key (an unknown or
replaced key refused), each typed as its schema says (``pulumi config set`` stores scalars as
strings), a secret checked as stored encrypted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from infra.naming import PROJECT
from infra.settings.checks import ConfigError

PROJECT_FILE = Path(__file__).resolve().parents[2] / "Pulumi.yaml"
REPO = PROJECT_FILE.parent
# Pulumi.yaml has no object type: a map setting is declared with a plain `value:` default.
_SCHEMA_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}
# Settings an earlier release read, and what a stack file that still sets one should do.
REPLACED_SETTINGS = {
    "spotNodes": "replaced by spot (the pool is all Spot or all dedicated, nodeCount nodes "
    "either way): remove spotNodes; to run on Spot, set spot: true",
}


def load_schema(path: Path = PROJECT_FILE) -> dict[str, dict[str, Any]]:
    """The ``config:`` schema of Pulumi.yaml keyed by short name (``vmSize``)."""
    project = yaml.safe_load(path.read_text(encoding="utf-8"))
    prefix = f"{project['name']}:"
    return {key.removeprefix(prefix): spec for key, spec in project["config"].items()}


def known_values(values: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` by short key; an unknown key is an error."""
    known: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = str(raw_key).removeprefix(f"{PROJECT}:")
        if key in REPLACED_SETTINGS:
            raise ConfigError(f"{key}: {REPLACED_SETTINGS[key]}")
        if key not in schema:
            raise ConfigError(
                f"unknown setting {key!r}; valid settings are {', '.join(sorted(schema))}"
            )
        known[key] = value
    return known


def typed_values(
    given: Mapping[str, Any], schema: Mapping[str, Any], secrets: Iterable[str]
) -> dict[str, Any]:
    """Every setting of ``schema`` but the ``secrets``, typed: the given value or the default."""
    typed: dict[str, Any] = {}
    for key, spec in schema.items():
        if key in secrets:
            check_encrypted(key, given.get(key))
            continue
        if key not in given and "default" not in spec and "value" not in spec:
            raise ConfigError(f"{key}: required; set it with `pulumi config set {key} ...`")
        typed[key] = typed_value(key, given.get(key, schema_default(spec)), spec)
    return typed


def schema_type(spec: Mapping[str, Any]) -> str:
    return str(spec.get("type", "object"))


def schema_default(spec: Mapping[str, Any]) -> Any:
    return spec["default"] if "default" in spec else spec.get("value")


def typed_value(key: str, value: Any, spec: Mapping[str, Any]) -> Any:
    """``value`` of the setting ``key`` as the type ``spec`` declares, or a ConfigError."""
    expected = _SCHEMA_TYPES[schema_type(spec)]
    # `pulumi config set` stores scalars as strings; structured values arrive as JSON text.
    if isinstance(value, str) and expected is int and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    if isinstance(value, str) and expected is bool and value in ("true", "false"):
        return value == "true"
    if isinstance(value, str) and expected in (list, dict) and value.strip()[:1] in ("[", "{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{key}={value!r}: not valid {schema_type(spec)} JSON") from None
    if (isinstance(value, bool) and expected is int) or not isinstance(value, expected):
        raise ConfigError(f"{key}={value!r}: expected {schema_type(spec)}")
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}={value!r}: expected a list of strings")
    return value


def check_encrypted(key: str, value: Any) -> None:
    """A secret setting is empty or encrypted: ``{secure: ...}`` in a stack file (as the offline
    plan reads it, or its JSON text as mocks pass it); never plain text in a tracked file."""
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = {}  # not JSON: plain text
    if value in (None, "") or (isinstance(value, dict) and set(value) == {"secure"}):
        return
    raise ConfigError(
        f"{key}: stored in plain text in the stack file; remove it and run "
        f"`pulumi config set --secret {key} <value>` so it is encrypted"
    )
