"""The check that no process of a run outlives it (tests/support/process_tree.py), on real
processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.process_tree import RUN_TAG, check_none_left, new_tag, tagged

# A parent that starts a child in its own session and exits at once: the child is re-parented
# (to init or a subreaper), so no walk of the parent's children can find it any more.
ORPHAN_MAKER = (
    "import subprocess, sys; "
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', 'orphan-of-"
    "{tag}'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
    "print(child.pid)"
)


def _orphan(tag: str) -> int:
    env = {**os.environ, RUN_TAG: tag}
    made = subprocess.run(
        [sys.executable, "-c", ORPHAN_MAKER.format(tag=tag)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(made.stdout)


def test_a_re_parented_orphan_is_found_named_by_its_command_line_and_killed():
    tag = new_tag()
    pid = _orphan(tag)
    assert [p.pid for p in tagged(tag)] == [pid]
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failure:
        check_none_left(tag, grace=0.5)
    assert time.monotonic() - started < 19  # the 0.5 s grace, not the 20 s default
    message = str(failure.value)
    assert "1 process(es) of the run outlived it" in message
    assert f"pid {pid} " in message and f"orphan-of-{tag}" in message
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert tagged(tag) == []


def test_processes_of_other_runs_and_finished_ones_pass():
    mine, other = new_tag(), new_tag()
    done = subprocess.run(
        [sys.executable, "-c", "pass"], env={**os.environ, RUN_TAG: mine}, timeout=30, check=True
    )
    assert done.returncode == 0
    pid = _orphan(other)
    try:
        check_none_left(mine, grace=0.5)  # another run's process is not this run's leftover
    finally:
        psutil.Process(pid).kill()


def test_a_process_that_ends_within_the_grace_period_passes():
    tag = new_tag()
    env = {**os.environ, RUN_TAG: tag}
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"], env=env)
    assert [p.pid for p in tagged(tag)] == [sleeper.pid]
    check_none_left(tag, grace=20)
    assert tagged(tag) == []  # exited: a zombie until reaped, which is not alive
    assert sleeper.wait(timeout=5) == 0
