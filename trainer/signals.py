"""Graceful stop on SIGTERM/SIGINT: a Batch task terminate or a Spot eviction notice.

The handler only sets a flag; the training loop checks it after every step with an allreduce,
so all ranks stop at the same step, write one checkpoint and exit 0. A second Ctrl-C stops
at once for an impatient user.
"""

from __future__ import annotations

import logging
import signal
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
