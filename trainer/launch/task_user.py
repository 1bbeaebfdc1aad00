"""The task user's identity inside the container: a name and a writable HOME for the workers.
Why it is built this way: docs/internals.md, `trainer/launch/task_user.py`."""

from __future__ import annotations

import os
import pwd
import tempfile
from collections.abc import Mapping

# What getpass.getuser() reads, in its order, before it asks the passwd database.
USER_VARIABLES = ("LOGNAME", "USER", "LNAME", "USERNAME")


def _passwd_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _writable_folder(path: str | None) -> bool:
    return bool(path) and os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)  # type: ignore[arg-type]


def _own_home(env: Mapping[str, str], uid: int) -> str:
    """A HOME only this uid can use: ``home`` in the task's folder on Batch, else a fresh
    private folder under the temporary folder (never a fixed name another uid could make)."""
    task_dir = env.get("AZ_BATCH_TASK_DIR")
    if task_dir and _writable_folder(task_dir):
        home = os.path.join(task_dir, "home")
        os.makedirs(home, mode=0o700, exist_ok=True)
        if os.stat(home).st_uid == uid:
            return home
    return tempfile.mkdtemp(prefix=f"home-{uid}-")


def task_user_environment(env: Mapping[str, str], uid: int | None = None) -> dict[str, str]:
    """``env`` with USER/LOGNAME, HOME and TORCHINDUCTOR_CACHE_DIR set where the task user's
    uid has no name or HOME is not a folder it can write; unchanged otherwise. Values already
    set that work are kept."""
    uid = os.getuid() if uid is None else uid
    out = dict(env)
    name = _passwd_name(uid)
    home_works = _writable_folder(out.get("HOME"))
    if name is not None and home_works:
        return out
    if not any(out.get(key) for key in USER_VARIABLES):
        out["USER"] = out["LOGNAME"] = name or f"uid{uid}"
    if not home_works:
        out["HOME"] = _own_home(out, uid)
    out.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(out["HOME"], ".cache", "torchinductor"))
    return out
