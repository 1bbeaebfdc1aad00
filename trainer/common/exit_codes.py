"""Exit codes the worker and the launcher agree on (the launcher reads them without importing
the torch side that sets them)."""

from __future__ import annotations

# The worker's exit code when its watchdog fired; the launcher names it (trainer.launch.workers).
WATCHDOG_EXIT = 86
