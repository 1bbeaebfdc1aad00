"""The docs a user reads keep naming real things: every link (and heading anchor) resolves, every
command line in a shell block runs a command, module or make target that exists with flags its
parser has, and every flag named in prose belongs to one of our parsers or to a named tool."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dt_commands import plan
from dt_commands.acceptance import main as acceptance
from dt_commands.jobs import main as dt_jobs
from trainer.data import __main__ as data_cli
from trainer.launch import options as launcher
from trainer.settings import flags as cli

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").rglob("*.md"))]

# The installed commands (pyproject's [project.scripts]) and the modules run with `python -m`.
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "dt-train": cli.build_parser,
    "dt-data": data_cli.build_parser,
    "dt-plan": plan.build_parser,
    "dt-jobs": dt_jobs.build_parser,
    "trainer": cli.build_parser,
    "trainer.launch": launcher.build_parser,
    "dt_commands.acceptance": acceptance.build_parser,
}
# Flags the docs name that belong to other tools, by tool.
FOREIGN_FLAGS = {
    "pulumi": {"--policy-pack", "--path", "--secret", "--target", "--json", "--secrets-provider"},
    "docker": {"--shm-size", "--ipc", "--stop-signal", "--stop-timeout", "--gpus", "--init"},
    "horovodrun": {"--gloo", "--check-build"},
    "torchrun": {"--standalone", "--nproc_per_node"},
    "az": {"--query", "--size"},
}
# Flags the docs name as removed from the trainer, which it must then not have.
REMOVED_FLAGS = {"--adasum"}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _every_parser() -> Iterator[argparse.ArgumentParser]:
    for build in PARSERS.values():
        parser = build()
        yield parser
        yield from _subcommands(parser).values()


def _shell_lines(text: str) -> Iterator[str]:
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\|\||;|\|", line):
                if part.strip():
                    yield part.strip()


def _words(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    return [w.strip("[]") for w in words if w.strip("[]")]


def _flags(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("--")]


def _check_command(words: list[str]) -> list[str]:
    """What is wrong with one command line (empty: nothing), or [] when it runs none of ours."""
    names = [Path(w).name for w in words]
    if "make" in names[:1]:
        targets = re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), re.M)
        target = words[1] if len(words) > 1 else ""
        problems = [] if target in targets else [f"make {target}: no such target"]
        extra = [a for w in words[2:] if w.startswith("ARGS=") for a in shlex.split(w[5:])]
        known = _options(acceptance.build_parser())
        return problems + [f"make {target} {f}" for f in _flags(extra) if f not in known]
    if "-m" in names:
        at = names.index("-m")
        module = words[at + 1] if at + 1 < len(words) else ""
        if importlib.util.find_spec(module) is None:
            return [f"python -m {module}: no such module"]
        command, rest = module, words[at + 2 :]
    else:
        found = next((i for i, n in enumerate(names) if n in PARSERS), None)
        if found is None:
            return []
        command, rest = names[found], words[found + 1 :]
    if command not in PARSERS:
        return []
    parser = PARSERS[command]()
    known = _options(parser)
    subcommands = _subcommands(parser)
    if subcommands and rest:  # a bare command name is prose, not a command line
        name = next((w for w in rest if not w.startswith("-")), "")
        if any(choice not in subcommands for choice in name.split("|")):  # prose: a|b
            return [f"{command} {name}: no such subcommand"]
        known = set().union(*(_options(subcommands[choice]) for choice in name.split("|")))
        if (command, name) == ("dt-jobs", "sweep"):  # its --local runs pass the rest on
            known |= _options(cli.build_parser())
    return [f"{command} {flag}" for flag in _flags(rest) if flag not in known]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(page):
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and anchor not in _anchors(file)):
            broken.append(target)
    assert broken == [], f"{page.name}: links that resolve to nothing: {broken}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_line_is_real(page):
    text = page.read_text(encoding="utf-8")
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    problems = [p for line in _shell_lines(text) for p in _check_command(_words(line))]
    for span in spans:
        if re.match(r"(\.venv/bin/)?(dt-|python -m |make )", span):
            problems += _check_command(_words(span))
    assert problems == [], f"{page.name}: {problems}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_flag_named_in_prose_exists(page):
    ours = set().union(*(_options(p) for p in _every_parser()))
    theirs = set().union(*FOREIGN_FLAGS.values(), REMOVED_FLAGS)
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    named = {f.split("=", 1)[0] for f in re.findall(r"`(--[a-z][\w-]*(?:=\S*)?)", text)}
    assert sorted(named - ours - theirs) == [], f"{page.name} names flags nothing has"


def test_the_checks_catch_what_they_should():
    """The checks themselves: a made-up flag, subcommand, module and target are each caught."""
    assert _check_command(_words("dt-jobs logs --stack dev --follow-forever"))
    assert _check_command(_words("dt-jobs tail --stack dev"))
    assert _check_command(_words(".venv/bin/python -m bench.no_such_bench"))
    assert _check_command(_words("make deploy-everything"))
    assert _check_command(_words("make azure-check ARGS=--no-such-flag"))
    assert not _check_command(_words("dt-jobs sweep --local --workers 1,2 --model resnet18"))
    assert not _check_command(_words("horovodrun --gloo -np 2 dt-train --model resnet50"))


def test_removed_flags_are_gone():
    assert REMOVED_FLAGS.isdisjoint(_options(cli.build_parser()))


def test_every_help_names_the_installed_command():
    for name in ("dt-train", "dt-data", "dt-plan", "dt-jobs"):
        assert PARSERS[name]().format_usage().startswith(f"usage: {name} ")
