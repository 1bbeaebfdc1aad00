"""After a failed try, the launcher asks its node's watcher (a root service the pool's start task
leaves running: infra/node_checks.py) to check the node again; a node that fails keeps itself
out of the pool, and the launcher records why before the node restarts (docs/jobs.md, A node
that fails). They meet in the task's folder (AZ_BATCH_TASK_DIR), the one Batch folder the task's
container always mounts.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainer.files import write_atomic

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
        time.sleep(poll)
    say(f"no node check verdict within {timeout:g} s: going on without one")
    return None


# A node that keeps itself out restarts RECORD_SECONDS after its verdict (infra/node_checks.py),
# time for its launcher to record why. Its launcher then holds its part of the try, and the
# primary's report waits RESTART_GRACE_SECONDS before it ends the try, so that Batch sees the
# restart take a running task (a recovery: the task runs again, and the node, whose start task
# now fails, gets none of it). Past RESTART_WAIT_SECONDS the launcher exits (a counted retry).
RECORD_SECONDS = 5
RESTART_GRACE_SECONDS = RECORD_SECONDS + 20
RESTART_WAIT_SECONDS = 120


def wait_for_restart(say: Callable[[str], None], seconds: float = RESTART_WAIT_SECONDS) -> None:
    """Wait (``seconds`` at most; a SIGTERM ends it) for the node to restart."""
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: done.set())
    say("waiting for this node to restart")
    if not done.wait(seconds):
        say(f"the node did not restart within {seconds:g} s: exiting")
