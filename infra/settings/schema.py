"""One declaration per stack setting: ``setting(key, default, description)`` on a section field.

The fields of infra.config's sections declare each setting once; its type comes from the field's
annotation. Pulumi.yaml's ``config:`` block, which the Pulumi CLI validates stack config against,
is written from these declarations (``python -m infra.config --write``), never by hand.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

import yaml

# A field's annotation (a string: the modules use postponed annotations) -> its schema type.
_TYPES = {
    "str": "string",
    "int": "integer",
    "bool": "boolean",
    "tuple[str, ...]": "array",
    "Mapping[str, Any]": "object",
}
BLOCK_START = "config:\n"


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


def _scalar(value: Any) -> str:
    if value == "":
        return '""'
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return (
        yaml.safe_dump(value, width=float("inf"), allow_unicode=True)
        .removesuffix("\n...\n")
        .rstrip("\n")
    )


def render_block(project: str, schema: dict[str, dict[str, Any]], notes: dict[str, str]) -> str:
    """Pulumi.yaml's ``config:`` block for ``schema``, in the file's own layout."""
    lines = [BLOCK_START.rstrip("\n")]
    for key, spec in schema.items():
        lines += [f"  # {line}" for line in notes.get(key, "").splitlines()]
        lines.append(f"  {project}:{key}:")
        for name, value in spec.items():
            if name == "items":
                lines += ["    items:", f"      type: {value['type']}"]
            else:
                lines.append(f"    {name}: {_scalar(value)}")
    return "\n".join(lines) + "\n"


def with_block(text: str, block: str) -> str:
    """Pulumi.yaml's ``text`` with its ``config:`` block (the file's last) replaced."""
    head, found, _ = text.partition(f"\n{BLOCK_START}")
    if not found:
        raise ValueError("Pulumi.yaml has no top-level config: block")
    return f"{head}\n{block}"
