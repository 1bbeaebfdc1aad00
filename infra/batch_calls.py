"""Calls to Batch's data plane as the job provider makes them: a refused call (401/403) retried
while a new role assignment propagates, a 404 believed only after further reads (Batch's
control plane is eventually consistent), and every other failure as one line (``JobError``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pulumi

from infra.batch import (
    error_code,
)
from infra.dynamic import OneLineError
from trainer.common.errors import first_line

T = TypeVar("T")


# New role assignments take minutes to reach Batch's data plane: until then it answers 403
# (401 while a token is not accepted yet). Retry those with growing pauses for this long.
AUTH_RETRY_SECONDS = 600.0
FIRST_AUTH_RETRY_SECONDS = 2.0
MAX_AUTH_RETRY_SECONDS = 60.0
# Batch's control plane is eventually consistent and documents no window: a job can be 404
# JobNotFound right after its add succeeded (microsoft/CromwellOnAzure #483 retries Job - Get
# on JobNotFound after the commit). A 404 for a job this provider just made, or one a refresh
# finds missing, is believed only after this many further reads this far apart.
NOT_FOUND_RETRIES = 4
NOT_FOUND_PAUSE_SECONDS = 2.0


class JobError(OneLineError):
    """A Batch call failed; one line naming the job, the call and the fix."""


class AccessRefused(JobError):
    """Batch kept refusing the caller (401/403) for as long as the call would wait."""

    def __init__(self, refusal: str, waited: float) -> None:
        self.refusal = refusal  # "Batch at <endpoint> refused to <what> (<status> <code>)"
        super().__init__(
            f"{refusal} for {waited:.0f} s: give the deployer a Batch data-plane role on the "
            "account (e.g. Azure Batch Job Submitter), wait for the role assignment to "
            "propagate, then run `pulumi up` again"
        )


def _error_code(err: Any) -> str:
    model = getattr(err, "model", None)
    return str(getattr(model, "code", None) or getattr(err, "reason", None) or "no code")


def batch_call(
    endpoint: str,
    what: str,
    call: Callable[[], T],
    auth_wait: float | None = None,
    expected: tuple[str, ...] = (),
) -> T:
    """``call()``, retrying Batch's authorization failures (401/403) with exponential backoff
    for up to ``auth_wait`` seconds (default ``AUTH_RETRY_SECONDS``): a role assignment made
    by this deployment takes minutes to reach the data plane. Then ``AccessRefused``; other
    Batch errors become one line; ``ResourceNotFoundError`` and the errors whose Batch code is
    in ``expected`` pass through for the caller."""
    from trainer.common.azure_sdk import AzureError, HttpResponseError, ResourceNotFoundError

    limit = AUTH_RETRY_SECONDS if auth_wait is None else auth_wait

    delay = FIRST_AUTH_RETRY_SECONDS
    waited = 0.0
    while True:
        try:
            return call()
        except ResourceNotFoundError:
            raise
        except HttpResponseError as err:
            if error_code(err) in expected:
                raise
            if err.status_code not in (401, 403):
                raise JobError(f"{what} at {endpoint} failed: {first_line(err)}") from None
            refused = (
                f"Batch at {endpoint} refused to {what} ({err.status_code} {_error_code(err)})"
            )
            if waited + delay > limit:
                raise AccessRefused(refused, waited) from None
            pulumi.log.warn(
                f"{refused}; a new role assignment can take minutes to propagate: "
                f"retrying in {delay:g} s"
            )
            time.sleep(delay)
            waited += delay
            delay = min(delay * 2, MAX_AUTH_RETRY_SECONDS)
        except AzureError as err:
            raise JobError(f"{what} at {endpoint} failed: {first_line(err)}") from None


def batch_call_seen(endpoint: str, what: str, call: Callable[[], T], **options: Any) -> T:
    """``batch_call`` that believes a 404 only once ``NOT_FOUND_RETRIES`` more calls got it too."""
    from trainer.common.azure_sdk import ResourceNotFoundError

    for _ in range(NOT_FOUND_RETRIES):
        try:
            return batch_call(endpoint, what, call, **options)
        except ResourceNotFoundError:
            time.sleep(NOT_FOUND_PAUSE_SECONDS)
    return batch_call(endpoint, what, call, **options)
