"""Graceful stop on SIGTERM/SIGINT: a Batch task terminate or a Spot eviction notice.

The handler only sets a flag; the training loop checks it after every step with an allreduce,
so all ranks stop at the same step, write one checkpoint and exit 0. A second Ctrl-C stops
at once for an impatient user.

``die_with_parent`` makes the death of the process that started this one (torchrun, horovodrun's
task, the Batch node launcher) a SIGTERM here, even when the parent was killed with SIGKILL and
could not stop its workers: they stop at the next step with a checkpoint instead of training on
unsupervised.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from types import FrameType

log = logging.getLogger(__name__)


class StopRequest:
    def __init__(self) -> None:
        self.requested = False

    def install(self) -> StopRequest:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        log.warning(
            "%s received: stopping after this step and saving a checkpoint",
            signal.Signals(signum).name,
        )


# prctl(2): deliver this signal to the calling process when its parent thread dies.
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies (every launcher that starts workers
    does so from its main thread, which lives as long as it does). Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        reason = os.strerror(ctypes.get_errno())
        log.warning("cannot ask to die with the parent process: %s", reason)
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
