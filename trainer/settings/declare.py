"""One declaration per trainer setting: ``setting(default, help)`` on a section's field, the one
home of its default and of the help ``dt-train --help`` prints for it (``help_of``)."""

from __future__ import annotations

from dataclasses import Field, field
from typing import Any


def setting(default: Any, help_text: str) -> Any:
    """A dataclass field with its default and its help beside it. A dict default is copied per
    instance (a dataclass allows no mutable default)."""
    metadata = {"help": help_text}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def help_of(f: Field[Any]) -> str:
    """The help a field declares (empty for a field declared without ``setting``)."""
    return f.metadata.get("help", "")


def is_switch(f: Field[Any]) -> bool:
    """A true/false setting: ``--name`` and ``--no-name`` on the command line. The modules use
    postponed annotations, so a field's type is the annotation's text."""
    return str(f.type) == "bool"
