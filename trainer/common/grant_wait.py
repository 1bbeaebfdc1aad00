"""Waiting out a role assignment that has not reached Storage yet.

A node's identity is granted its data role on the storage account by the same ``pulumi up`` that
creates the pool, and "Azure role assignments may take up to 30 minutes to propagate"
(azure-docs articles/storage/blobs/authorize-access-azure-active-directory.md). Until then
Storage answers 403 ``AuthorizationPermissionMismatch``. ``GrantWait.call`` retries such a call:
one log line per wait, waits at most a minute apart, for at most ``minutes`` in all (counted from
the first refusal, shared by every thread using the same ``GrantWait``), then one line naming the
role that is missing. Any other error goes to the caller unchanged. Another service's refusal
of a role not arrived yet (an AzureML workspace's 403 ``AuthorizationFailed``) is a ``Refusal``.

The Azure SDK is imported inside functions: the trainer's command line loads without it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# The documented propagation time (see above): the default bound on the wait.
GRANT_WAIT_MINUTES = 30.0
# About this many waits fit in the bound (at most a minute apart): short bounds retry quickly.
WAITS_PER_BOUND = 30
MAX_PAUSE_S = 60.0
PENDING = "AuthorizationPermissionMismatch"
# Storage's firewall refusing the caller's address: a different fix (the account's IP rules),
# never waited out (SupportArticles-docs storage-troubleshoot-403-errors.md, read 2026-11-28).
FIREWALL_REFUSAL = "AuthorizationFailure"
READER = "Storage Blob Data Reader"
CONTRIBUTOR = "Storage Blob Data Contributor"


class GrantMissing(Exception):
    """The role was still missing when the wait's bound ran out (a one-line message)."""


def is_pending(err: BaseException) -> bool:
    """Whether ``err`` is Storage's refusal of an identity without the data role."""
    from trainer.common.azure_sdk import HttpResponseError

    return (
        isinstance(err, HttpResponseError)
        and err.status_code == 403
        and getattr(err, "error_code", None) == PENDING
    )


def is_firewall_refusal(err: BaseException) -> bool:
    """Whether ``err`` is Storage's firewall refusing this machine's address."""
    return getattr(err, "status_code", None) == 403 and (
        getattr(err, "error_code", None) == FIREWALL_REFUSAL
    )


def identity() -> str:
    """Who is refused, as the operator can look it up: the managed identity the job names in
    ``AZURE_CLIENT_ID`` on a node, else the Azure CLI's login."""
    client_id = os.environ.get("AZURE_CLIENT_ID")
    return f"identity {client_id}" if client_id else "the signed-in identity (az login)"


def missing_role(role: str) -> str:
    """The fix, in words, for an identity that lacks ``role``."""
    return f"{identity()} lacks {role} on the storage account"


@dataclass(frozen=True)
class Refusal:
    """How a service refuses an identity whose role has not arrived: which errors, and the
    words for them and for what is missing. Storage's by default (``STORAGE``)."""

    matches: Callable[[BaseException], bool]
    service: str  # "Storage": who refuses
    refused: str  # "access (AuthorizationPermissionMismatch)": what it refuses, and how
    missing: Callable[[str], str]  # the role -> who lacks it where


STORAGE = Refusal(is_pending, "Storage", f"access ({PENDING})", missing_role)


class GrantWait:
    """Retries calls that Storage (or the service ``refusal`` names) refuses for want of a role
    that has not arrived yet."""

    def __init__(
        self,
        role: str,
        minutes: float = GRANT_WAIT_MINUTES,
        *,
        log: Callable[[str], None] = print,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        refusal: Refusal = STORAGE,
    ) -> None:
        if minutes < 0:
            raise ValueError(f"minutes={minutes}: must be >= 0")
        self.role, self.minutes, self.log, self.refusal = role, minutes, log, refusal
        self._sleep, self._clock = sleep, clock
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._waits = 0  # how many waits have ended: a thread refused before one retries now
        self.pause_s = min(MAX_PAUSE_S, minutes * 60 / WAITS_PER_BOUND)

    def call(self, fn: Callable[[], T], where: str) -> T:
        """``fn()``, called again after each wait while Storage refuses it for want of the role;
        GrantMissing when the bound runs out."""
        while True:
            waits = self._waits
            try:
                return fn()
            except Exception as err:
                if not self.refusal.matches(err):
                    raise
            self._wait(waits, where)

    def _wait(self, waits: int, where: str) -> None:
        with self._lock:  # one thread waits and logs; the others wait for it, silently
            if self._waits != waits:
                return  # a wait ended since this thread's call began: try again at once
            now = self._clock()
            if self._deadline is None:
                self._deadline = now + self.minutes * 60
            left = self._deadline - now
            refusal, missing = self.refusal, self.refusal.missing(self.role)
            if left <= 0:
                raise GrantMissing(
                    f"{where}: {refusal.service} still refuses {refusal.refused} after "
                    f"{self.minutes:g} min: {missing}; assign it (the stack grants it to the "
                    "nodes' identity), or wait for the assignment to propagate (up to 30 min), "
                    "then rerun"
                )
            pause = min(self.pause_s, left)
            self.log(
                f"{where}: {refusal.service} refuses {refusal.refused}: {missing} yet (a new role "
                f"assignment takes up to 30 min to propagate); retrying in {pause:.3g} s, for "
                f"{left / 60:.3g} min more"
            )
            self._sleep(pause)
            self._waits += 1
