"""One declaration per stack setting: ``setting(key, default, description)`` on a section field.

The fields of the sections (``infra.settings.network``, ``cluster``, ...) declare each setting
once; its type comes from the field's annotation. ``schema_of`` gives the ``config:`` schema they
declare, which ``infra.settings.pulumi_yaml`` writes into Pulumi.yaml, never by hand.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

# A field's annotation (a string: the modules use postponed annotations) -> its schema type.
_TYPES = {
    "str": "string",
    "int": "integer",
    "bool": "boolean",
    "tuple[str, ...]": "array",
    "Mapping[str, Any]": "object",
}


@dataclass(frozen=True)
class Setting:
    """A stack setting as Pulumi.yaml declares it: ``key`` (camelCase), a description and a
    default (``MISSING``: required); ``note`` becomes a YAML comment above the key."""

    key: str
    description: str
    default: Any = MISSING
    note: str = ""


def setting(key: str, default: Any = MISSING, description: str = "", *, note: str = "") -> Any:
    """A dataclass field declaring the stack setting ``key``: the one home of its default and
    description."""
    metadata = {"setting": Setting(key, description, default, note)}
    if default is MISSING:
        return field(metadata=metadata)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def declared(cls: type) -> list[tuple[Field[Any], Setting]]:
    """The fields of ``cls`` that declare a stack setting, in declaration order."""
    return [(f, f.metadata["setting"]) for f in fields(cls) if "setting" in f.metadata]


def spec_of(f: Field[Any], declaration: Setting) -> dict[str, Any]:
    """The Pulumi.yaml spec of one declared field. Pulumi.yaml has no object type: a map setting
    carries a plain ``value:`` default."""
    kind = _TYPES.get(str(f.type))
    if kind is None:
        raise TypeError(f"{f.name}: {f.type} has no Pulumi config type (use {', '.join(_TYPES)})")
    spec: dict[str, Any] = {} if kind == "object" else {"type": kind}
    if kind == "array":
        spec["items"] = {"type": "string"}
    spec["description"] = declaration.description
    if declaration.default is not MISSING:
        default = declaration.default
        spec["value" if kind == "object" else "default"] = (
            list(default) if isinstance(default, tuple) else default
        )
    return spec


def schema_of(*classes: type) -> dict[str, dict[str, Any]]:
    """The ``config:`` schema the classes declare, keyed by short name (``vmSize``)."""
    schema: dict[str, dict[str, Any]] = {}
    for cls in classes:
        for f, declaration in declared(cls):
            if declaration.key in schema:
                raise TypeError(f"{declaration.key}: declared twice ({cls.__name__}.{f.name})")
            schema[declaration.key] = spec_of(f, declaration)
    return schema


def notes_of(*classes: type) -> dict[str, str]:
    return {d.key: d.note for cls in classes for _, d in declared(cls) if d.note}
