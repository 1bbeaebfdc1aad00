"""Run the checkout's Python as another uid, wherever the checkout sits.

A Batch task's user is a uid of its own (the pool's auto-user), so some tests run the trainer as
such a uid with ``setpriv``. That uid must reach the checkout (its package and its virtualenv), and
a checkout inside a folder only root may enter (``mktemp -d`` makes them mode 0700) is out of its
reach: "No module named 'trainer'". There the child runs in a mount namespace of its own in which
the checkout is bound at a folder any uid can enter; nothing outside that namespace sees it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def reachable_by_any_uid(path: Path) -> bool:
    """Whether a uid without a name or groups may enter every folder down to ``path``."""
    return all(folder.stat().st_mode & 0o001 for folder in (path, *path.parents))


def run_as_uid(
    uid: int, argv: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``argv`` run as ``uid`` (its group too, no others) with ``env``; the checkout's paths in
    both are the checkout as that uid can reach it."""
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    if reachable_by_any_uid(REPO):
        return _run([*setpriv, *argv], env, timeout)
    view = Path(tempfile.mkdtemp(prefix="checkout-"))
    try:
        view.chmod(0o755)
        seen = [_seen_from(view, arg) for arg in argv]
        bind = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, "sh"]
        seen_env = {key: _seen_from(view, value) for key, value in env.items()}
        return _run([*wrapper, str(REPO), str(view), *setpriv, *seen], seen_env, timeout)
    finally:
        shutil.rmtree(view)  # empty again: the bind lived only in the child's namespace


def _seen_from(view: Path, value: str) -> str:
    return value.replace(str(REPO), str(view))


def _run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def can_switch_uid() -> bool:
    """``setpriv --reuid`` needs root (and ``unshare --mount`` too, where it is used)."""
    return os.geteuid() == 0 and shutil.which("setpriv") is not None
