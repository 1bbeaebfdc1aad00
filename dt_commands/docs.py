"""The config reference in docs/config-reference.md, generated from the typed schema in Pulumi.yaml.

python -m dt_commands.docs            # print the table
python -m dt_commands.docs --write    # rewrite it in docs/config-reference.md between the markers
"""

from __future__ import annotations

import json
import sys

from infra.settings.values import REPO, load_schema, schema_default, schema_type
from trainer.common.cli import OneLineParser

REFERENCE = REPO / "docs" / "config-reference.md"
START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def config_reference() -> str:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, spec in load_schema().items():
        has_default = "default" in spec or "value" in spec
        default = f"`{json.dumps(schema_default(spec))}`" if has_default else "required"
        description = " ".join(str(spec["description"]).split())
        lines.append(f"| `{key}` | {schema_type(spec)} | {default} | {description} |")
    return "\n".join(lines)


def with_reference(page: str) -> str:
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{config_reference()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m dt_commands.docs", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"rewrite {REFERENCE.name}")
    args = parser.parse_args(argv)
    if args.write:
        REFERENCE.write_text(
            with_reference(REFERENCE.read_text(encoding="utf-8")), encoding="utf-8"
        )
    else:
        print(config_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
