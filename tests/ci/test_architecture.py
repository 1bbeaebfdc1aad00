"""The import rules ARCHITECTURE.md states, checked on the import graph of the project's code.

Every import statement is an edge, at module level or inside a function (a lazy import runs
too, only later), and importing ``a.b.c`` runs the packages ``a`` and ``a.b`` first. A
``must not import`` rule binds a module's own import statements; a ``must not reach`` rule binds
everything importing the module can end up importing (the transitive closure), and names the
chain that gets there. No module may reach itself: a circle of imports is reported with its
import lines. The rules are read from the document's ``rules`` block, so the document and the
check cannot drift apart."""

from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = REPO / "ARCHITECTURE.md"
# The packages the rules are about: what ships (the trainer image, the Pulumi program, the
# policy pack, the operator's commands). bench/ and tests/ may import anything.
CHECKED = ("trainer", "infra", "policy", "dt_commands")
# The code whose imports make the graph: bench/ and scripts/ may import anything, but not in a
# circle.
GRAPHED = (*CHECKED, "bench", "scripts")
RULE = re.compile(
    r"^(?:(?P<only>only) (?P<allowed>[\w. ]+?) may (?P<only_verb>import|reach) (?P<guarded>[\w. ]+)"
    r"|(?P<importers>[\w. ]+?) must not (?P<verb>import|reach) (?P<targets>[\w. ]+?)"
    r"(?: except (?P<exceptions>[\w. ]+))?)$"
)


@dataclass(frozen=True)
class Rule:
    text: str
    importers: tuple[str, ...]  # the modules the rule binds
    targets: tuple[str, ...]
    exceptions: tuple[str, ...] = ()
    reach: bool = False  # True: binds all a module reaches; False: its own imports

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
            allowed, guarded = match["allowed"].split(), match["guarded"].split()
            reach = match["only_verb"] == "reach"
            rules.append(OnlyRule(line, tuple(allowed), tuple(guarded), reach=reach))
        else:
            importers, targets = match["importers"].split(), match["targets"].split()
            exceptions = (match["exceptions"] or "").split()
            reach = match["verb"] == "reach"
            rules.append(Rule(line, tuple(importers), tuple(targets), tuple(exceptions), reach))
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


Modules = dict[str, tuple[str, bool]]  # name -> (source, is a package's __init__)
Graph = dict[str, dict[str, int]]  # module -> {what it imports: the line of the first import}


def resolve(name: str, modules: Modules) -> str:
    """The project module ``name`` runs (``infra.naming.PROJECT`` -> ``infra.naming``), or the
    name itself when it is outside the project (``torch``, ``azure.core.exceptions.X``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if (candidate := ".".join(parts[:end])) in modules:
            return candidate
    return name


def import_graph(modules: Modules) -> Graph:
    """Each module's own import statements, resolved; a module importing itself is no edge."""
    graph: Graph = {}
    for module, (source, is_package) in modules.items():
        edges: dict[str, int] = {}
        for line, imported in sorted(imports_of(source, module, is_package)):
            target = resolve(imported, modules)
            if target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def packages_of(name: str, modules: Modules) -> list[str]:
    """The project packages Python runs before ``name`` (``a`` and ``a.b`` for ``a.b.c``)."""
    parts = name.split(".")
    return [p for end in range(1, len(parts)) if (p := ".".join(parts[:end])) in modules]


def _steps(graph: Graph, modules: Modules, module: str) -> list[tuple[str, str]]:
    """(next module, how: ``module:line``) for what importing ``module`` runs next: its imports
    and the packages they are in."""
    steps = []
    for target, line in graph.get(module, {}).items():
        steps += [(package, f"{module}:{line}") for package in packages_of(target, modules)]
        steps.append((target, f"{module}:{line}"))
    return steps


def reach(graph: Graph, modules: Modules, module: str) -> dict[str, list[str]]:
    """Everything importing ``module`` can run, each with the shortest chain of imports that
    gets there. A package's ``__init__`` is followed but not listed itself: importing a package
    runs only what its ``__init__`` imports, which is listed."""
    chains: dict[str, list[str]] = {module: []}
    for package in packages_of(module, modules):
        chains[package] = [f"{package} (its package)"]
    queue = deque(chains)
    while queue:
        current = queue.popleft()
        for target, how in _steps(graph, modules, current):
            if target not in chains:
                chains[target] = [*chains[current], how]
                queue.append(target)
    return {
        name: [*chain, name]
        for name, chain in chains.items()
        if name != module and not modules.get(name, ("", False))[1]
    }


def cycles(graph: Graph) -> list[str]:
    """One circle of imports through each module that is on one, as ``a:line -> b:line -> a``
    (each import statement's line), shortest first; a circle is reported once. Only import
    statements count: a package's ``__init__`` that imports its own modules (``trainer.data``)
    makes no circle, though each of them runs it first, as long as none imports it by name."""
    found: list[str] = []
    seen: set[frozenset[str]] = set()
    for start in sorted(graph):
        back: dict[str, str | None] = {start: None}
        queue, closing = deque([start]), None
        while queue and closing is None:
            current = queue.popleft()
            for target in graph[current]:
                if target == start:
                    closing = current
                    break
                if target in graph and target not in back:
                    back[target] = current
                    queue.append(target)
        if closing is None:
            continue
        path = [closing]
        while (previous := back[path[-1]]) is not None:
            path.append(previous)
        path.reverse()
        if frozenset(path) in seen:
            continue
        seen.add(frozenset(path))
        hops = [f"{m}:{graph[m][n]}" for m, n in zip(path, [*path[1:], start], strict=True)]
        found.append(" -> ".join([*hops, start]))
    return sorted(found, key=lambda text: (text.count("->"), text))


def violations(modules: Modules, rules: list[Rule]) -> list[str]:
    """Every break of ``rules`` by a module of the checked packages (bench/ is in the graph,
    so what it imports counts when a checked module imports it, but no rule binds it)."""
    graph = import_graph(modules)
    found = []
    for module, (source, is_package) in sorted(modules.items()):
        if not _within(module, (*CHECKED, "__main__")):
            continue
        reached = reach(graph, modules, module) if any(r.reach for r in rules) else {}
        for rule in rules:
            if rule.reach:
                found += [
                    f"{module} reaches {name} ({' -> '.join(chain)}): breaks `{rule.text}`"
                    for name, chain in sorted(reached.items())
                    if rule.violated_by(module, name)
                ]
            else:
                found += [
                    f"{module}:{line} imports {imported}: breaks `{rule.text}`"
                    for line, imported in imports_of(source, module, is_package)
                    if rule.violated_by(module, imported)
                ]
    return found


def project_modules(packages: tuple[str, ...] = GRAPHED) -> Modules:
    modules = {"__main__": ((REPO / "__main__.py").read_text(encoding="utf-8"), False)}
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            name, is_package = module_name(path)
            modules[name] = (path.read_text(encoding="utf-8"), is_package)
    return modules


def test_the_project_keeps_the_import_rules_of_architecture_md():
    rules = parse_rules(DOCUMENT.read_text(encoding="utf-8"))
    found = violations(project_modules(), rules)
    assert not found, "\n".join(found)


def test_no_circle_of_imports():
    """No circle of imports anywhere, lazy ones included: a circle makes a module's meaning
    depend on which of its members is imported first, and puts every member in each other's
    layer."""
    found = cycles(import_graph(project_modules()))
    assert not found, "circles of imports:\n" + "\n".join(found)


def test_the_rules_name_modules_that_exist():
    """A misspelt or moved module in a rule would bind nothing, silently."""
    modules = project_modules()
    named = {
        name
        for rule in parse_rules(DOCUMENT.read_text(encoding="utf-8"))
        for name in (*rule.importers, *rule.targets, *rule.exceptions)
        if name.split(".")[0] in (*GRAPHED, "__main__")
    }
    assert sorted(name for name in named if name not in modules) == []


def test_a_circle_is_named_with_its_import_lines():
    modules = {
        "infra.a": ("from infra import b\n", False),
        "infra.b": ("import os\n\ndef f():\n    from infra.c import g\n", False),
        "infra.c": ("from infra.a import x\n", False),
        "infra.d": ("import infra.a\n", False),
    }
    assert cycles(import_graph(modules)) == ["infra.a:1 -> infra.b:4 -> infra.c:1 -> infra.a"]


def test_a_reach_rule_names_the_chain_that_breaks_it():
    modules = {
        "policy": ("", True),
        "policy.rules": ("from infra import naming\n", False),
        "infra": ("", True),
        "infra.naming": ("def f():\n    from infra.config import X\n", False),
        "infra.config": ("import trainer.cli\n", False),
        "trainer": ("", True),
        "trainer.cli": ("import argparse\n", False),
    }
    rule = parse_rules("```rules\npolicy must not reach trainer\n```")
    assert violations(modules, rule) == [
        "policy.rules reaches trainer.cli (policy.rules:1 -> infra.naming:2 -> infra.config:1 "
        "-> trainer.cli): breaks `policy must not reach trainer`"
    ]


def test_importing_a_module_runs_its_packages():
    """``import a.b.c`` runs ``a/b/__init__.py``: what that imports is reached too."""
    modules = {
        "infra.sizes": ("from trainer.launch.fabric import SIZES\n", False),
        "trainer": ("", True),
        "trainer.launch": ("from trainer.launch import supervisor\n", True),
        "trainer.launch.fabric": ("import os\n", False),
        "trainer.launch.supervisor": ("import torch\n", False),
    }
    reached = reach(import_graph(modules), modules, "infra.sizes")
    assert reached["torch"] == [
        "infra.sizes:1",
        "trainer.launch:1",
        "trainer.launch.supervisor:1",
        "torch",
    ]
    assert "trainer.launch" not in reached  # a package is followed, not listed


def test_the_rules_catch_what_they_forbid():
    """Each stated rule fails on a module written to break it, a reach rule through a module in
    between (a check that cannot fail checks nothing)."""
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
        if rule.reach:  # bench/ is bound by no rule
            broken = {
                importer: ("def f():\n    import bench.between\n", False),
                "bench.between": (f"import {target}\n", False),
            }
        else:
            broken = {importer: (f"def f():\n    import {target}\n", False)}
        found = [v for v in violations(broken, [rule]) if v.startswith(importer)]
        assert found, f"`{rule.text}` let {importer} import {target}"


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
        for package in (
            *CHECKED,
            # every room of the trainer: a room that is not named here goes unchecked
            *(
                str(init.parent.relative_to(REPO))
                for init in (REPO / "trainer").glob("*/__init__.py")
            ),
            "infra/settings",
            "dt_commands/jobs",
            "dt_commands/acceptance",
        )
        for path in sorted((REPO / package).glob("*.py"))
        if path.stem != "__init__" and path.stem not in named
    ]
    assert missing == [], f"ARCHITECTURE.md Layout does not name {missing}"
