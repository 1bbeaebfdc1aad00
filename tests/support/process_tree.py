"""No process of a run outlives it: a check for the tests that start real multi-process runs.

Every process a test starts inherits the test's environment, so a variable set for the test
(``RUN_TAG``, a fresh value per test) marks every process of its runs: launchers, workers,
Horovod's per-worker middlemen, loader workers, and the orphans that the kernel re-parents to
init when their parent dies, which a walk of the launcher's children would miss. The check reads
``/proc/<pid>/environ`` of every process (root reads any; another user's processes are skipped,
and no test runs them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable

import psutil
import pytest

RUN_TAG = "TRAINER_TEST_RUN_TAG"
# A run that ended may still be taking its last processes down (a launcher's workers stop at
# the next step after it died, then write a checkpoint): long enough for that, bounded so a
# leftover fails the test instead of hanging it.
GRACE_SECONDS = 20.0


def new_tag() -> str:
    return uuid.uuid4().hex


def running(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes of ``pids`` still alive (zombies excluded: they have exited)."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def tagged(tag: str) -> list[psutil.Process]:
    """Every live process carrying ``RUN_TAG=tag``."""
    entry = f"\0{RUN_TAG}={tag}\0".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as file:
                # Entries are NUL-terminated; a leading NUL makes the first one match too.
                environ = b"\0" + file.read()
        except OSError:  # gone, or not ours to read
            continue
        if entry in environ:
            pids.append(int(name))
    return running(pids)


def describe(process: psutil.Process) -> str:
    try:
        command = " ".join(process.cmdline()) or process.name()
        return f"pid {process.pid} (parent {process.ppid()}): {command}"[:400]
    except psutil.NoSuchProcess:
        return f"pid {process.pid} (exited while being described)"


def check_none_left(tag: str, grace: float = GRACE_SECONDS) -> None:
    """Fail naming every process tagged ``tag`` still alive after ``grace`` seconds."""
    fail_if_any_left(lambda: tagged(tag), grace, "of the run outlived it")


def fail_if_any_left(find: Callable[[], list[psutil.Process]], grace: float, what: str) -> None:
    """Fail naming every process ``find`` still returns after ``grace`` seconds; they are
    killed first, so one leaking test does not slow or confuse the tests after it."""
    deadline = time.monotonic() + grace
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not left:
        return
    descriptions = [describe(process) for process in left]
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    psutil.wait_procs(left, timeout=5)  # gone (or a zombie) before the next test starts
    pytest.fail(
        f"{len(left)} process(es) {what} by {grace:g} s (killed now):\n" + "\n".join(descriptions),
        pytrace=False,
    )
