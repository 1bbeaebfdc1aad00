"""The user-facing commands of ``[project.scripts]``, run as a user runs them: the console
scripts the editable install puts next to the interpreter (``make setup``)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_command_is_installed_and_answers_help(name):
    script = Path(sys.executable).parent / name
    assert script.exists(), f"{script} is missing: run `make setup` after changing pyproject.toml"
    result = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_command_says_bad_input_in_one_line(name):
    script = Path(sys.executable).parent / name
    result = subprocess.run(
        [str(script), "--no-such-flag"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


# Every command a person or CI runs as `python -m ...` (bench.run_all and bench.plots take no
# arguments; bench.allreduce_probe is started by bench.allreduce, not by people).
MODULES = (
    "trainer",
    "trainer.data",
    "trainer.launch",
    "dt_commands.plan",
    "dt_commands.jobs",
    "dt_commands.stacks",
    "dt_commands.preview_jobs",
    "dt_commands.docs",
    "dt_commands.acceptance",
    "bench.allreduce",
    "bench.checkpoint_io",
    "bench.code_change",
    "bench.data_path",
    "bench.gpu",
    "bench.overhead",
    "bench.program_eval",
    "bench.scaling",
)


@pytest.mark.parametrize("module", MODULES)
def test_every_entry_point_has_the_one_parser_style(module):
    """One style everywhere: an unknown flag is one line naming it, exit code 2, no usage."""
    result = subprocess.run(
        [sys.executable, "-m", module, "--no-such-flag"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr == "error: unrecognized arguments: --no-such-flag (see --help)\n" or (
        result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    )
