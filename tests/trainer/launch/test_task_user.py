"""The workers' user inside a Batch container: a uid the image does not know, HOME ``/``.

Batch maps the task's auto-user uid into the container (articles/batch/
batch-docker-container-workloads.md); the image knows only its own user 1000, so Docker sets
HOME to ``/`` and the uid has no passwd entry (the node emulator, tests/batch_emulator/tasks.py,
runs container tasks the same way). Here the launcher runs as such a uid (``setpriv --reuid``, as
tests/infra/test_cloud_init.py does) and its worker checks what ``--compile`` and
``getpass.getuser()`` need.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.other_uid import REPO, can_switch_uid, run_as_uid
from tests.support.ports import free_port
from trainer.launch.task_user import task_user_environment

TASK_UID = 12345  # no passwd entry on this machine or in the image
PROBE = """
import getpass, os
print("user", getpass.getuser())
home = os.environ["HOME"]
with open(os.path.join(home, "written"), "w") as f:
    f.write("ok")
print("home", home)
# What Inductor's cache_dir() does with TORCHINDUCTOR_CACHE_DIR (torch/_inductor/runtime/
# cache_dir_utils.py): make it, then write compiled kernels into it.
cache = os.path.abspath(os.environ["TORCHINDUCTOR_CACHE_DIR"])
os.makedirs(cache, exist_ok=True)
open(os.path.join(cache, "kernel"), "w").close()
print("cache", cache)
"""

needs_root = pytest.mark.skipif(not can_switch_uid(), reason="setpriv --reuid needs root")


@pytest.fixture
def task_dir() -> Iterator[Path]:
    """The task's folder, the task user's (as Batch makes it), with the probe, in a folder any
    uid can reach (pytest's own tmp folders are root's only)."""
    root = Path(tempfile.mkdtemp(prefix="task-user-"))
    root.chmod(0o755)
    task = root / "task"
    task.mkdir()
    os.chown(task, TASK_UID, TASK_UID)
    (root / "probe.py").write_text(PROBE, encoding="utf-8")
    (root / "probe.py").chmod(0o644)
    yield task
    shutil.rmtree(root)


def _system_python() -> str:
    """A python the task uid may run (the venv's links into root's own folder)."""
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for the worker")
    return python


def _as_task_user(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_as_uid(TASK_UID, argv, env, timeout=120)


def _container_env(task: Path) -> dict[str, str]:
    """What a container task starts with: no USER or LOGNAME, HOME "/", Batch's variables."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/",
        "PYTHONPATH": str(REPO),
        "AZ_BATCH_TASK_DIR": str(task),
        "AZ_BATCH_HOST_LIST": "127.0.0.1",
        "AZ_BATCH_MASTER_NODE": f"127.0.0.1:{free_port()}",
        "AZ_BATCH_IS_CURRENT_NODE_MASTER": "true",
        "MASTER_PORT": str(free_port()),
    }


@needs_root
def test_without_help_the_task_uid_has_no_name_and_no_home_it_can_write(task_dir):
    """The condition itself: a worker started with the container's environment fails."""
    probe = str(task_dir.parent / "probe.py")
    result = _as_task_user([_system_python(), probe], _container_env(task_dir))
    assert result.returncode != 0
    assert "KeyError" in result.stderr or "OSError" in result.stderr  # getpass.getuser()


@needs_root
def test_the_launchers_workers_get_a_name_a_writable_home_and_an_inductor_cache(task_dir):
    probe = str(task_dir.parent / "probe.py")
    launcher = [sys.executable, "-m", "trainer.launch", "--workers-per-node", "1"]
    launcher += ["--node-ip", "127.0.0.1", "--", _system_python(), probe]
    result = _as_task_user(launcher, _container_env(task_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    home = task_dir / "home"
    assert f"user uid{TASK_UID}" in result.stdout
    assert f"home {home}" in result.stdout
    assert f"cache {home / '.cache' / 'torchinductor'}" in result.stdout
    assert (home / "written").read_text() == "ok"
    assert home.stat().st_uid == TASK_UID and home.stat().st_mode & 0o777 == 0o700


def test_a_known_user_with_a_writable_home_keeps_its_environment(tmp_path):
    env = {"HOME": str(tmp_path), "PATH": "/bin"}
    assert task_user_environment(env, uid=0) == env  # root is in every passwd database


def test_a_name_already_set_is_kept_and_home_is_private_without_a_task_folder(tmp_path):
    env = task_user_environment({"HOME": "/nonexistent", "USER": "batchuser"}, uid=TASK_UID)
    assert env["USER"] == "batchuser" and "LOGNAME" not in env
    home = Path(env["HOME"])
    try:
        assert home.is_dir() and home.stat().st_mode & 0o777 == 0o700
        assert env["TORCHINDUCTOR_CACHE_DIR"] == str(home / ".cache" / "torchinductor")
    finally:
        shutil.rmtree(home)
