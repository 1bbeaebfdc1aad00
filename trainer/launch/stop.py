"""The launcher's SIGTERM/SIGINT handler, installed at its first instant.

On Batch the launcher is the container's first process (``infra/batch.py`` execs it from
``/bin/bash -c``), PID 1 of the container's PID namespace, and the kernel drops a signal to a
namespace's PID 1 that has no handler for it ("a process running as PID 1 inside a container is
treated specially by Linux: it ignores any signal with the default action", docs.docker.com,
docker run reference, --init). A `docker stop` signals that process only and kills the container
after its grace period; so a terminate that comes before the launcher has a handler (while it
imports, or waits minutes for the other nodes to meet) would be lost. This module imports
nothing slow, and ``python -m trainer.launch`` installs the handler before anything else; what
the signal then does (stop waiting, not start workers, forward it to the workers) is decided by
the launcher (``trainer.launch.workers``) through ``forward_to``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType


class StopSignal:
    """The first SIGTERM/SIGINT this process received, and where later ones go."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._forward: Callable[[int], None] | None = None
        self._installed = False

    def install(self) -> StopSignal:
        if not self._installed:
            signal.signal(signal.SIGTERM, self._handle)
            signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def forward_to(self, callback: Callable[[int], None] | None) -> None:
        """From now on each signal calls ``callback``; one received already calls it at once."""
        self._forward = callback
        if callback is not None and self.signum is not None:
            callback(self.signum)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum
        if self._forward is not None:
            self._forward(signum)


STOP = StopSignal()
