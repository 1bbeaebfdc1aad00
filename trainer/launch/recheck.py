"""After a failed try, the launcher asks its node's watcher (a root service the pool's start task
leaves running: infra/node_checks.py) to check the node again; a node that fails keeps itself
out of the pool, and the launcher records why before the node restarts (docs/jobs.md, A node
that fails). They meet in the task's folder (AZ_BATCH_TASK_DIR), the one Batch folder the task's
container always mounts.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path

from trainer.common.files import write_atomic

# In the task's folder. The watcher finds requests under the node's workitems/ and removes each
# at once (its content is never read: a task user may have made it a link to anything); its
# answer, "ok" or "sick <reason>", replaces the verdict file.
REQUEST = "node-check-request"
VERDICT = "node-check-verdict"
# The watcher looks every second: a request still there after this means no watcher runs on
# the node (a run outside Batch, or a node that joined before the pool had one).
TAKEN_SECONDS = 5
# The watcher bounds its check at 60 s (a hung nvidia-smi is a verdict too); past this the
# launcher goes on without one.
VERDICT_SECONDS = 75


def check_node(
    task_dir: Path | None,
    say: Callable[[str], None],
    timeout: float = VERDICT_SECONDS,
    taken: float = TAKEN_SECONDS,
    poll: float = 0.2,
) -> str | None:
    """Why this node keeps itself out, or None: it passed, or no watcher took the request, or
    no verdict came in time (each said)."""
    if task_dir is None:
        return None
    request, verdict = task_dir / REQUEST, task_dir / VERDICT
    try:
        verdict.unlink(missing_ok=True)
        write_atomic(request, b"check\n")
    except OSError as err:
        say(f"cannot ask for a node check: {err}")
        return None
    say("the try failed: asking this node's watcher to check the node")
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if request.exists() and time.monotonic() - started > taken:
            request.unlink(missing_ok=True)
            say("no node watcher took the request: the node is not checked")
            return None
        try:
            result = verdict.read_text().strip()
        except OSError:
            result = ""
        if result == "ok":
            say("the node passed its checks")
            return None
        if result.startswith("sick"):
            return result.removeprefix("sick").strip() or "its checks failed"
        if result.startswith("unrecorded"):
            failed = result.removeprefix("unrecorded").strip()
            say(f"the node failed its checks ({failed}) but cannot record it, so it cannot keep "
                "itself out: `dt-jobs keep-out` it")  # fmt: skip
            return None
        time.sleep(poll)
    say(f"no node check verdict within {timeout:g} s: going on without one")
    return None


# A node that keeps itself out restarts once its launcher has recorded why and taken the verdict
# (removed the file), or RECORD_SECONDS after the verdict (infra/node_checks.py). The launcher
# then holds its part of the try, so that the restart takes a running task: for Batch a
# recovery, which runs the task again, without the node, whose start task now fails. Past
# RESTART_WAIT_SECONDS it exits, and the try fails as any other.
RECORD_SECONDS = 30
RESTART_WAIT_SECONDS = 120


def wait_for_restart(
    task_dir: Path | None, say: Callable[[str], None], seconds: float = RESTART_WAIT_SECONDS
) -> None:
    """Take the verdict (the node may restart now) and wait ``seconds`` at most for it. A
    SIGTERM is the restart coming (Docker and systemd stop processes first): ignored, so that
    the task is still running when the VM goes."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if task_dir is not None:
        with contextlib.suppress(OSError):
            (task_dir / VERDICT).unlink(missing_ok=True)
    say("waiting for this node to restart")
    time.sleep(seconds)
    say(f"the node did not restart within {seconds:g} s: exiting")
