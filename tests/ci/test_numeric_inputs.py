"""Every numeric input of every entry point, generated: NaN, infinities, negative and huge
values on each numeric option of each command and subcommand (found by walking the parsers of
``[project.scripts]``, the node launcher and the acceptance check), on each numeric setting of
the trainer's ``--config`` YAML and on each integer setting of a stack file. Each is one line on
stderr naming the option or setting, exit 2, never a traceback; the few values a setting takes
on purpose (a Batch job priority of -1) are accepted within their documented range only."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dt_commands import plan
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from infra.settings.values import load_schema, schema_type
from tests.support.stacks import REPO
from trainer.settings.train_config import TrainConfig

VALUES = ("nan", "inf", "-inf", "-1", "1e308", "99999999999999999999")
# The same in YAML (1.1: a float needs a dot, "1e308" alone is a string) and as a string.
YAML_VALUES = (".nan", ".inf", "-.inf", "-1", "1.0e+308", "99999999999999999999", "'nan'")
# Commands beside [project.scripts], run as `python -m MODULE` (Batch, make azure-check).
MODULE_COMMANDS = {
    "python -m trainer.launch": "trainer.launch.main:main",
    "python -m dt_commands.acceptance": "dt_commands.acceptance.main:main",
}
# An entry point whose parser lives beside it: dt-train's main parses with trainer.settings.flags.
PARSER_HOMES = {"trainer.__main__": "trainer.settings.flags"}
# How each command runs as a process.
RUN_AS = {
    "dt-train": "trainer",
    "dt-data": "trainer.data",
    "dt-plan": "dt_commands.plan",
    "dt-jobs": "dt_commands.jobs",
    "python -m trainer.launch": "trainer.launch",
    "python -m dt_commands.acceptance": "dt_commands.acceptance",
}
TRAIN_NUMBERS = ("int", "float", "tuple")


def commands() -> dict[str, str]:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    return {**scripts, **MODULE_COMMANDS}


def parser_of(target: str) -> argparse.ArgumentParser:
    module = target.split(":")[0]
    return importlib.import_module(PARSER_HOMES.get(module, module)).build_parser()


def _is_number(kind: Callable[[str], Any]) -> bool:
    """Whether an option's type reads numbers: it turns "1", "1.5" or "1,2" into one."""
    for text in ("1", "1.5", "1,2"):
        try:
            value = kind(text)
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            continue
        items = value if isinstance(value, tuple) else (value,)
        if items and all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
            return True
    return False


def _train_field_is_number(dest: str) -> bool:
    """dt-train's flags are text until TrainConfig types them: a number if its field is one."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(TrainConfig)}
    return fields.get(dest, "").startswith(TRAIN_NUMBERS)


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, argparse.Action]]:
    """(subcommands, the parser that owns the option, the option) for every option of a parser
    and of its subparsers, at any depth."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))
        elif action.option_strings:
            yield path, parser, action


def numeric_options() -> list[tuple[str, tuple[str, ...], argparse.Action]]:
    found = []
    for command, target in commands().items():
        for path, _, action in walk(parser_of(target)):
            typed = action.type is not None and _is_number(action.type)
            if typed or (command == "dt-train" and _train_field_is_number(action.dest)):
                found.append((command, path, action))
    return found


NUMERIC = numeric_options()


def located(
    command: str, path: tuple[str, ...], flag: str
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.Action]:
    """A fresh parser of ``command``, the (sub)parser that owns ``flag`` and its option."""
    parser = parser_of(commands()[command])
    for sub, owner, action in walk(parser):
        if sub == path and flag in action.option_strings:
            return parser, owner, action
    raise LookupError(flag)


def required_args(parser: argparse.ArgumentParser, skip: argparse.Action) -> list[str]:
    """The least a parser needs besides the option under test: each required option and the
    first of each required group (its first choice, else "1"), then the positionals after
    ``--``."""
    chosen = [a for a in parser._actions if a.required and a.option_strings and a is not skip]
    for group in parser._mutually_exclusive_groups:
        if group.required and skip not in group._group_actions:
            chosen.append(group._group_actions[0])
    argv: list[str] = []
    for action in chosen:
        value = [] if action.nargs == 0 else [str(sorted(action.choices or ["1"])[0])]
        argv += [action.option_strings[0], *value]
    positionals = [a for a in parser._actions if not a.option_strings and a.nargs != "?"]
    positionals = [a for a in positionals if not isinstance(a, argparse._SubParsersAction)]
    return [*argv, "--", *["1" for _ in positionals]] if positionals else argv


def _exit_of(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except SystemExit as stop:
        return stop.code


def _refused(err: str, *names: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert any(name in err for name in names), err
    assert "Traceback" not in err


def test_the_walk_finds_every_command_and_subcommand():
    walked = {(command, path) for command, path, _ in NUMERIC}
    assert {command for command, _ in walked} >= {"dt-train", "dt-data", "dt-plan", "dt-jobs"}
    assert {"python -m trainer.launch", "python -m dt_commands.acceptance"} <= set(commands())
    for subcommand in ("prepare", "prepare-text", "upload", "stage"):
        assert ("dt-data", (subcommand,)) in walked
    assert {("dt-jobs", ("metrics",)), ("dt-jobs", ("sweep",))} <= walked
    assert ("python -m trainer.launch", ()) in walked
    # The acceptance check's options are all names and choices: nothing numeric to feed it.
    assert not any(command.endswith("acceptance") for command, _ in walked)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize(
    ("command", "path", "flag"),
    [
        pytest.param(command, path, a.option_strings[-1], id=f"{command} {' '.join(path)} {a.dest}")
        for command, path, a in NUMERIC
        if command != "dt-train"
    ],
)
def test_a_bad_number_on_an_option_is_one_line_and_exit_2(capsys, command, path, flag, value):
    parser, owner, action = located(command, path, flag)
    argv = [*path, f"{flag}={value}", *required_args(owner, action)]
    assert _exit_of(lambda: parser.parse_args(argv)) == 2, f"{command} accepted {argv}"
    _refused(capsys.readouterr().err, flag)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize(
    "flag", [a.option_strings[0] for command, _, a in NUMERIC if command == "dt-train"]
)
def test_a_bad_number_on_a_trainer_flag_is_one_line_and_exit_2(capsys, flag, value):
    from trainer.__main__ import main

    # --dry-run: were the value accepted, the test would build a model, not train one.
    assert _exit_of(lambda: main([f"{flag}={value}", "--dry-run"])) == 2
    _refused(capsys.readouterr().err, flag[2:].replace("-", "_"), flag)


@pytest.mark.parametrize("value", YAML_VALUES)
@pytest.mark.parametrize(
    "name", [f.name for f in dataclasses.fields(TrainConfig) if _train_field_is_number(f.name)]
)
def test_a_bad_number_in_a_trainer_config_file_is_one_line_and_exit_2(
    capsys, tmp_path, name, value
):
    from trainer.__main__ import main

    config = tmp_path / "train.yaml"
    config.write_text(f"{name}: {value}\n", encoding="utf-8")
    assert _exit_of(lambda: main(["--config", str(config), "--dry-run"])) == 2
    _refused(capsys.readouterr().err, f"{name}=")


# A stack setting's documented range, where one of VALUES is inside it (Batch job priorities run
# from -1000 to 1000).
ACCEPTED = {"priority": range(-1000, 1001)}
STACK_FILE = REPO / "Pulumi.dev.yaml"


def _stack_cases() -> list[tuple[str, str]]:
    schema = load_schema()
    keys = [key for key, spec in schema.items() if schema_type(spec) in ("integer", "number")]
    return [(key, value) for key in [*keys, "jobs.nodes", "jobs.priority"] for value in YAML_VALUES]


@pytest.mark.parametrize(("key", "value"), _stack_cases())
def test_a_bad_number_in_a_stack_file_is_one_line(key, value):
    values = dict(plan.read_stack_file(STACK_FILE))
    number = yaml.safe_load(value)
    if key.startswith("jobs."):
        job = {"trainerConfig": "trainer/presets/demo.yaml", key.split(".")[1]: number}
        values["gpu-cluster:jobs"] = {"a": job}
    else:
        values[f"gpu-cluster:{key}"] = number
    try:
        settings = StackSettings.from_mapping("dev", values, load_schema())
    except ConfigError as err:
        line = f"error: {err}\n"
        _refused(line, f"{key.replace('jobs.', 'jobs.a.')}=")
    else:
        # Accepted: only an integer inside its setting's documented range.
        [job] = settings.jobs
        assert number in ACCEPTED[key.split(".")[-1]] and job.priority == number


# ---------------------------------------------------------------- as a user runs them
def _samples() -> list[tuple[str, list[str]]]:
    """Per command, its first numeric option with NaN and its last with a huge integer."""
    samples = []
    for command in sorted({command for command, _, _ in NUMERIC}):
        options = [(p, a) for c, p, a in NUMERIC if c == command]
        for (path, action), value in ((options[0], "nan"), (options[-1], VALUES[-1])):
            flag = action.option_strings[-1]
            _, owner, action = located(command, path, flag)
            samples.append((command, [*path, f"{flag}={value}", *required_args(owner, action)]))
    return samples


def _sample_id(item: str | list[str]) -> str:
    return item if isinstance(item, str) else " ".join(item)[:60]


@pytest.mark.parametrize(("command", "argv"), _samples(), ids=_sample_id)
def test_commands_run_as_processes_refuse_bad_numbers_in_one_line(tmp_path, command, argv):
    process = subprocess.run(
        [sys.executable, "-m", RUN_AS[command], *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert process.returncode == 2, process.stderr
    assert "Traceback" not in process.stderr
    assert process.stderr.count("\n") == 1 and process.stdout == "", process.stderr


def test_a_stack_file_with_a_nan_is_one_line_from_dt_plan(tmp_path):
    text = STACK_FILE.read_text(encoding="utf-8")
    stack_file = tmp_path / "Pulumi.dev.yaml"
    stack_file.write_text(text.replace("nodeCount: 2", "nodeCount: .nan"), encoding="utf-8")
    process = subprocess.run(
        [sys.executable, "-m", "dt_commands.plan", "--stack", "dev", "--stack-file", stack_file],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert process.returncode == 2
    assert process.stderr == "error: nodeCount=nan: expected integer\n"


def test_the_data_flags_are_refused_before_anything_is_read(tmp_path):
    """The numbers are checked by the parser: a missing source is not reached."""
    missing = Path(tmp_path / "nowhere")
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.data",
            "prepare",
            missing,
            tmp_path / "o",
            "--shard-mb=inf",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert process.returncode == 2
    assert process.stderr == (
        "error: argument --shard-mb: 'inf': give a number in (0, 65536] (see --help)\n"
    )
