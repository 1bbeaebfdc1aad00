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
