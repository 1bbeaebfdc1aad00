"""The import rules ARCHITECTURE.md states, checked on every import statement (module level or
inside a function) of the project's packages: the rules are read from the document's ``rules``
block, so the document and the check cannot drift apart."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = REPO / "ARCHITECTURE.md"
# The packages the rules are about: what ships (the trainer image, the Pulumi program, the
# policy pack). bench/ and tests/ may import anything.
CHECKED = ("trainer", "infra", "policy")
RULE = re.compile(
    r"^(?:(?P<only>only) (?P<allowed>[\w. ]+?) may import (?P<guarded>[\w. ]+)"
    r"|(?P<importers>[\w. ]+?) must not import (?P<targets>[\w. ]+?)"
    r"(?: except (?P<exceptions>[\w. ]+))?)$"
)


@dataclass(frozen=True)
class Rule:
    text: str
    importers: tuple[str, ...]  # the modules the rule binds
    targets: tuple[str, ...]
    exceptions: tuple[str, ...] = ()

    def violated_by(self, module: str, imported: str) -> bool:
        return (
            _within(module, self.importers)
            and _within(imported, self.targets)
            and not _within(imported, self.exceptions)
        )


@dataclass(frozen=True)
class OnlyRule(Rule):
    """``only A may import X``: every module but A's must not import X."""

    def violated_by(self, module: str, imported: str) -> bool:
        return _within(imported, self.targets) and not _within(module, self.importers)


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def parse_rules(text: str) -> list[Rule]:
    block = re.search(r"```rules\n(.*?)```", text, re.S)
    assert block, f"{DOCUMENT.name} has no ```rules block"
    rules: list[Rule] = []
    for line in block.group(1).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = RULE.match(line)
        assert match, f"{DOCUMENT.name}: cannot read the rule {line!r}"
        if match["only"]:
            rules.append(
                OnlyRule(line, tuple(match["allowed"].split()), tuple(match["guarded"].split()))
            )
        else:
            importers, targets = match["importers"].split(), match["targets"].split()
            exceptions = (match["exceptions"] or "").split()
            rules.append(Rule(line, tuple(importers), tuple(targets), tuple(exceptions)))
    return rules


def module_name(path: Path) -> tuple[str, bool]:
    """The dotted name of a source file, and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imports_of(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) of every import in ``source``; ``from a import b`` counts as
    ``a.b`` (b may be a module); relative imports are resolved as Python resolves them."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                package = package[: len(package) - node.level + (1 if is_package else 0)]
                base = ".".join([*package, *([base] if base else [])])
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def violations(modules: dict[str, tuple[str, bool]], rules: list[Rule]) -> list[str]:
    found = []
    for module, (source, is_package) in sorted(modules.items()):
        for line, imported in imports_of(source, module, is_package):
            found += [
                f"{module}:{line} imports {imported}: breaks `{rule.text}`"
                for rule in rules
                if rule.violated_by(module, imported)
            ]
    return found


def project_modules() -> dict[str, tuple[str, bool]]:
    modules = {"__main__": ((REPO / "__main__.py").read_text(encoding="utf-8"), False)}
    for package in CHECKED:
        for path in sorted((REPO / package).rglob("*.py")):
            name, is_package = module_name(path)
            modules[name] = (path.read_text(encoding="utf-8"), is_package)
    return modules


def test_the_project_keeps_the_import_rules_of_architecture_md():
    rules = parse_rules(DOCUMENT.read_text(encoding="utf-8"))
    assert violations(project_modules(), rules) == []


def test_the_rules_catch_what_they_forbid():
    """Each stated rule fails on a module written to break it (a check that cannot fail checks
    nothing)."""
    rules = parse_rules(DOCUMENT.read_text(encoding="utf-8"))
    assert len(rules) >= 6
    for rule in rules:
        if isinstance(rule, OnlyRule):  # a module outside the allowed ones
            importer = next(
                f"{p}.probe" for p in CHECKED if not _within(f"{p}.probe", rule.importers)
            )
        else:
            importer = f"{rule.importers[0]}.probe"
        target = f"{rule.targets[0]}.inner"
        broken = {importer: (f"def f():\n    import {target}\n", False)}
        assert violations(broken, [rule]), f"`{rule.text}` let {importer} import {target}"


@pytest.mark.parametrize(
    "source, module, is_package, expected",
    [
        ("from . import cli", "trainer.launch.supervisor", False, ["trainer.launch.cli"]),
        ("from ..cli import fail", "trainer.launch.supervisor", False, ["trainer.cli.fail"]),
        (
            "from .supervisor import main",
            "trainer.launch",
            True,
            ["trainer.launch.supervisor.main"],
        ),
        ("import horovod.torch as hvd", "trainer.distributed", False, ["horovod.torch"]),
    ],
)
def test_imports_are_resolved_as_python_resolves_them(source, module, is_package, expected):
    assert [name for _, name in imports_of(source, module, is_package)] == expected


def test_the_layout_names_every_module():
    """ARCHITECTURE.md's Layout section matches the tree: each module of the shipped packages
    is named there (by file or module name)."""
    architecture = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    layout = architecture[architecture.index("## Layout") :]
    layout = layout[: layout.index("```", layout.index("```") + 3)]
    named = set(re.findall(r"[A-Za-z_]+", layout))
    missing = [
        str(path.relative_to(REPO))
        for package in (*CHECKED, "trainer/data", "trainer/launch", "infra/tools")
        for path in sorted((REPO / package).glob("*.py"))
        if path.stem != "__init__" and path.stem not in named
    ]
    assert missing == [], f"ARCHITECTURE.md Layout does not name {missing}"
