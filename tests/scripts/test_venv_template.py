"""The set-up's cached environment (scripts/venv_template.py) on small real venvs: a restored one
runs from its own path and never changes the template it came from; the key follows every input
that decides what pip installs."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from scripts import venv_template

SCRIPT = Path(venv_template.__file__)


def _environment(path: Path) -> Path:
    """A venv at ``path`` with a console script naming its interpreter, as pip writes them, a
    module in site-packages and a binary under bin/ that happens to hold the path."""
    venv.create(path, with_pip=False, symlinks=True)
    tool = path / "bin" / "tool"
    tool.write_text(f"#!{path}/bin/python\nimport sys, module\nprint(sys.prefix, module.VALUE)\n")
    tool.chmod(0o755)
    (path / "bin" / "binary").write_bytes(b"\x7fELF\0\0" + str(path).encode())
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run(
        [path / "bin" / "python", "-c", purelib], capture_output=True, text=True, check=True
    ).stdout.strip()
    (Path(site) / "module.py").write_text("VALUE = 42\n")
    return Path(site)


def test_a_restored_environment_runs_from_its_own_path_and_the_template_stays_as_saved(tmp_path):
    cache, first = tmp_path / "cache", tmp_path / "first" / ".venv"
    site = _environment(first)
    venv_template.save(cache, "k1", first)
    template = cache / "venv" / "k1"
    saved = {p: p.read_bytes() for p in template.rglob("*") if p.is_file() and not p.is_symlink()}
    subprocess.run(["rm", "-rf", str(tmp_path / "first")], check=True)  # the template is whole

    second = tmp_path / "second" / ".venv"
    second.parent.mkdir()
    assert venv_template.restore(cache, "k1", second)
    ran = subprocess.run([second / "bin" / "tool"], capture_output=True, text=True, check=True)
    assert ran.stdout.split() == [str(second), "42"]
    assert f"{second}" in (second / "pyvenv.cfg").read_text()
    assert not list(second.glob(".template-*"))  # the markers stay with the template
    assert not list(second.parent.glob("*.restoring"))
    # Files are hard links to the template's (a second, not a copy of gigabytes), except the
    # rewritten scripts, which are new files; a binary naming the path is left as it is.
    module = second / site.relative_to(tmp_path / "first" / ".venv") / "module.py"
    assert module.stat().st_ino == (template / module.relative_to(second)).stat().st_ino
    assert (second / "bin/tool").stat().st_ino != (template / "bin/tool").stat().st_ino
    assert (second / "bin/binary").stat().st_ino == (template / "bin/binary").stat().st_ino
    # What the clone writes (as pip does: a new file in place of the old) leaves the template.
    (second / "bin" / "tool").write_text("changed\n")
    now = {p: p.read_bytes() for p in template.rglob("*") if p.is_file() and not p.is_symlink()}
    assert now == saved


def test_one_template_is_kept_an_expired_or_unfinished_one_is_not_restored(tmp_path, monkeypatch):
    cache, source = tmp_path / "cache", tmp_path / "source" / ".venv"
    _environment(source)
    venv_template.save(cache, "k1", source)
    venv_template.save(cache, "k2", source)
    assert sorted(p.name for p in (cache / "venv").iterdir()) == ["k2"]

    complete = cache / "venv" / "k2" / venv_template.COMPLETE
    old = complete.stat().st_mtime - venv_template.MAX_AGE_SECONDS - 60
    os.utime(complete, (old, old))
    assert not venv_template.restore(cache, "k2", tmp_path / "expired")
    assert not (tmp_path / "expired").exists()
    venv_template.save(cache, "k2", source)  # a set-up that installed afresh replaces it
    assert venv_template.restore(cache, "k2", tmp_path / "renewed")

    # A save that stops half-way leaves nothing a restore would take.
    calls = []

    def fail_after_some(source_file, target):
        calls.append(source_file)
        if len(calls) > 5:
            raise OSError("disk full")
        os.link(source_file, target)

    monkeypatch.setattr(venv_template, "_link_or_copy", fail_after_some)
    with pytest.raises(OSError):
        venv_template.save(cache, "k3", source)
    monkeypatch.undo()
    assert not venv_template.restore(cache, "k3", tmp_path / "half")
    assert not (tmp_path / "half").exists()


def test_the_key_follows_the_inputs_files_and_pips_configuration(tmp_path, monkeypatch):
    pyproject, constraints = tmp_path / "pyproject.toml", tmp_path / "constraints.txt"
    pyproject.write_text('dependencies = ["torch==2.13.0"]\n')
    constraints.write_text("numpy<=2.4\n")
    monkeypatch.setenv("PIP_CONSTRAINT", str(constraints))

    def key():
        return venv_template.key(sys.executable, [str(pyproject)])

    first = key()
    assert key() == first
    pyproject.write_text('dependencies = ["torch==2.14.0"]\n')
    second = key()
    assert second != first
    constraints.write_text("numpy<=2.5\n")  # a constraints file pip is set to read
    assert key() != second


def test_the_command_line_says_when_there_is_no_template_and_refuses_unknown_commands(tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
        )

    missing = run("restore", str(tmp_path / "cache"), "k1", str(tmp_path / ".venv"))
    assert (missing.returncode, missing.stderr) == (venv_template.NO_TEMPLATE, "")
    unknown = run("frobnicate")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert "unknown command 'frobnicate'" in unknown.stderr
