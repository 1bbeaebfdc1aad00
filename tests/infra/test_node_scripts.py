"""How the program fills its script files and hands a script to bash (infra/node_scripts/), and
the filled scripts as a node runs them, shellcheck clean: the start task of every size and the
check and watcher it writes, the NFS server's setup and readiness gate."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest
import yaml

import infra.node_scripts as node_scripts
from infra.cloud_init import SETUP_SCRIPT, ready_command, render_nfs_cloud_init
from infra.node_checks import node_check_command
from infra.node_scripts import in_bash, render
from infra.sizes import CPU_ACCEPTANCE, SUPPORTED
from tests.ci.test_shellcheck import SCRIPTS, shellcheck

HEADER = "# shellcheck shell=bash\n# What it is for.\n\n"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setattr(node_scripts, "FOLDER", tmp_path)
    return tmp_path


def test_a_script_is_sent_without_its_header_and_with_its_values(folder):
    (folder / "a.sh").write_text(HEADER + "sleep __SECONDS__\necho __WHO__/x $((1 + __N__))\n")
    assert render("a.sh", SECONDS=5, WHO="/var/lib", N=2) == "sleep 5\necho /var/lib/x $((1 + 2))\n"


def test_a_line_of_its_own_takes_a_whole_script_or_nothing(folder):
    (folder / "a.sh").write_text(HEADER + "set -e\n__PART__\necho done\n")
    assert render("a.sh", PART="x=1\ny=2\n") == "set -e\nx=1\ny=2\necho done\n"
    assert render("a.sh", PART="") == "set -e\necho done\n"
    with pytest.raises(ValueError, match="__PART__ takes a script ending in a newline"):
        render("a.sh", PART="x=1")


def test_a_shebang_is_sent_and_the_header_after_it_is_not(folder):
    (folder / "a.sh").write_text("#!/bin/bash\n# Why.\n\nset -e\n")
    assert render("a.sh") == "#!/bin/bash\nset -e\n"


def test_filling_refuses_a_missing_or_unused_value_and_a_value_of_many_lines(folder):
    (folder / "a.sh").write_text(HEADER + "echo __ONE__\n")
    with pytest.raises(KeyError, match=r"a\.sh: no value for __ONE__"):
        render("a.sh")
    with pytest.raises(KeyError, match=r"a\.sh: no placeholder for TWO"):
        render("a.sh", ONE=1, TWO=2)
    with pytest.raises(ValueError, match="__ONE__ takes one line"):
        render("a.sh", ONE="a\nb")


def test_a_script_without_a_header_is_refused(folder):
    (folder / "a.sh").write_text("set -e\necho hi\n")
    with pytest.raises(ValueError, match="opens with no header"):
        render("a.sh")


def test_bash_gets_the_script_as_one_word_and_the_last_step_can_replace_it():
    script = 'printf \'%s\\n\' "it\'s" && echo "$0"'
    assert shlex.split(in_bash(script)) == ["/bin/bash", "-c", script]
    ran = subprocess.run(shlex.split(in_bash(script)), capture_output=True, text=True, timeout=30)
    assert ran.stdout == "it's\n/bin/bash\n"
    steps = shlex.split(in_bash("true", "cd /", "echo $$ $BASHPID", exec_last=True))
    assert steps[2] == "true && cd / && exec echo $$ $BASHPID"
    ran = subprocess.run(steps, capture_output=True, text=True, timeout=30)
    pid, bash_pid = ran.stdout.split()  # exec'd: echo runs as bash itself, in no subshell
    assert pid == bash_pid
    assert shlex.split(in_bash("false", "echo no", exec_last=True))[2] == "false && exec echo no"


SHAPES = sorted({(s.gpus, s.ib_ports, s.nvme_disks) for s in SUPPORTED.values()})
SHAPES += sorted({(s.gpus, s.ib_ports, s.nvme_disks) for s in CPU_ACCEPTANCE.values()})


# The filled scripts have no headers: the warnings the files' headers disable (each with its
# reason) are left out, and only those.
MEANT = sorted(
    {
        code
        for f in SCRIPTS
        for code in re.findall(r"^# shellcheck disable=(SC\d+)", f.read_text(), re.M)
    }
)


def _clean(script: str, tmp_path, name: str) -> None:
    path = tmp_path / name
    path.write_text(script)
    result = shellcheck("--shell=bash", f"--exclude={','.join(MEANT)}", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "{}gpus-{}ib-{}nvme".format(*s))
def test_the_filled_start_task_and_what_it_writes_are_shellcheck_clean(shape, tmp_path):
    script = shlex.split(node_check_command(*shape))[2]
    _clean(script, tmp_path, "start-task")
    written = dict(re.findall(r"<<'(\w+)'\n(.*?\n)\1\n", script, re.S))
    assert set(written) == {"CHECK", "WATCH"}
    for name, text in written.items():
        _clean(text, tmp_path, name)


def test_the_filled_nfs_setup_and_gate_are_shellcheck_clean(tmp_path):
    document = yaml.safe_load(render_nfs_cloud_init(3, "10.20.0.0/20"))
    setup = next(f["content"] for f in document["write_files"] if f["path"] == SETUP_SCRIPT)
    _clean(setup, tmp_path, "setup")
    _clean(shlex.split(ready_command())[2], tmp_path, "gate")
