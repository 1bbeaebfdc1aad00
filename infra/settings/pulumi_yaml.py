"""Pulumi.yaml's ``config:`` block, which the Pulumi CLI checks stack config against, written from
the fields that declare each setting (``python -m infra.settings --write``), never by hand;
``dt_commands.docs`` writes docs/config-reference.md from that block."""

from __future__ import annotations

import json
from typing import Any

import yaml

from infra.naming import PROJECT
from infra.settings.schema import notes_of, schema_of
from infra.settings.stack import DECLARING
from infra.settings.values import PROJECT_FILE

BLOCK_START = "config:\n"


def declared_schema() -> dict[str, dict[str, Any]]:
    """Pulumi.yaml's ``config:`` schema as the declarations give it (``load_schema`` reads the
    file; a test keeps the two equal)."""
    return schema_of(*DECLARING)


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


def main(argv: list[str] | None = None) -> int:
    """python -m infra.settings [--write]: print Pulumi.yaml's ``config:`` block as the
    declarations give it, or rewrite the block in Pulumi.yaml."""
    from trainer.common.cli import OneLineParser

    parser = OneLineParser(prog="python -m infra.settings", description=main.__doc__)
    parser.add_argument("--write", action="store_true", help=f"rewrite {PROJECT_FILE.name}")
    args = parser.parse_args(argv)
    block = render_block(PROJECT, declared_schema(), notes_of(*DECLARING))
    if args.write:
        text = PROJECT_FILE.read_text(encoding="utf-8")
        PROJECT_FILE.write_text(with_block(text, block), encoding="utf-8")
    else:
        print(block, end="")
    return 0
