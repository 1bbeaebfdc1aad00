"""The task user's identity inside the container: a name and a writable HOME for the workers.

Batch runs a container task as the task's user identity, a non-admin auto-user here, and maps
that user's uid into the container ("For Linux, Batch will map the user/group permission to the
container", articles/batch/batch-docker-container-workloads.md). Batch does not document that
uid; it is not the image's own user (1000, /home/trainer), so the uid has no passwd entry in the
image and Docker sets HOME to ``/``. Then ``getpass.getuser()`` raises (no LOGNAME/USER and no
passwd entry), which torch's Inductor (``--compile``) calls to name its cache folder, and
nothing can write ``~`` (Triton's cache, ``~/.cache``).

``task_user_environment`` gives the workers what is missing: USER and LOGNAME, a HOME of their
own in the task's folder (``AZ_BATCH_TASK_DIR``, which Batch makes the task user's and mounts
into the container), and TORCHINDUCTOR_CACHE_DIR under it, so compiled kernels never land in a
folder another uid made. Where the user is known and HOME writable (a laptop, the image's own
user) nothing changes. Standard library only.
"""

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
