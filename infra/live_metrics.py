"""What a job's rank 0 uploaded while it trains (``trainer.outputs.live_upload``), read from the
deployer's side: by the operator CLI (``dt-jobs``, ``dt_commands.jobs``) and by the job resource's
refresh (``infra.job``), which puts the current step and images/s into the stack's outputs.

The nodes and their NFS run folder are in a private network; the Blob account is reachable from
the addresses in storageAllowedIps. Reads use the process's one credential
(``infra.credentials``: ``az login`` on a laptop; Storage Blob Data Reader).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from infra import credentials
from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import first_line
from trainer.common.grant_wait import FIREWALL_REFUSAL, is_firewall_refusal
from trainer.watch.noise_scale import advice

METRICS_FILE = "metrics.jsonl"  # trainer.outputs.metrics.MetricsWriter's file, as uploaded
# A refresh and ``list`` read only the end of each job's metrics.jsonl: its last training record.
TAIL_BYTES = 64 * 1024


class StorageError(RuntimeError):
    """Reading what the trainer uploaded failed (exit code 1: an environment fault)."""

    code = 1


class NotUploaded(StorageError):
    """Nothing uploaded there yet."""


def blob_container(folder: BlobFolder, *, timeout: float | None = None) -> Any:
    """A client of the folder's container, with the one credential of this process;
    ``timeout`` bounds each connect and read (seconds)."""
    from trainer.common.azure_sdk import ContainerClient, LinearRetry

    # Two quick retries: the SDK's default waits 15 s and more between tries, long for a
    # command someone waits on (an address missing from storageAllowedIps fails at once anyway).
    extra: dict[str, Any] = {}
    if timeout is not None:
        extra = {"connection_timeout": timeout, "read_timeout": timeout}
    return ContainerClient(
        folder.account_url,
        folder.container,
        credential=credentials.credential(),
        retry_policy=LinearRetry(backoff=1, retry_total=2, random_jitter_range=1),
        **extra,
    )


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """The SDK's exceptions as one line naming the URL and what to do."""
    from trainer.common.azure_sdk import (
        AzureError,
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
    )

    try:
        yield
    except ResourceNotFoundError:
        raise NotUploaded(
            f"{url}: nothing uploaded yet (rank 0 uploads every --metrics-upload-minutes once "
            "training runs, when the job's trainer command has --metrics-upload-url)"
        ) from None
    except ClientAuthenticationError as err:
        raise StorageError(
            f"{url}: cannot authenticate ({_said(err)}); log in with `az login`"
        ) from None
    except HttpResponseError as err:
        raise StorageError(f"{url}: {_said(err)}{_refusal_hint(err)}") from None
    except AzureError as err:
        raise StorageError(f"{url}: cannot reach it ({_said(err)})") from None


def _refusal_hint(err: Any) -> str:
    """What to do about a 403: Storage's firewall (AuthorizationFailure) and a missing data
    role (AuthorizationPermissionMismatch) need different fixes (SupportArticles-docs
    storage-troubleshoot-403-errors.md, read 2026-11-28)."""
    if err.status_code != 403:
        return ""
    code = getattr(err, "error_code", None)
    if is_firewall_refusal(err):
        return (
            f" (403 {FIREWALL_REFUSAL}: the account's firewall refused this machine's "
            "address); add it to the stack's storageAllowedIps"
        )
    return (
        f" (403 {code or 'Forbidden'}); reading needs Storage Blob Data Reader on this "
        "container, which the stack grants on logs and outputs to its deployer and its team's "
        "group (jobSubmitterObjectId); a new assignment takes up to 30 min to arrive"
    )


def _said(err: BaseException) -> str:
    """An error's first line, its closing full stop dropped: it is quoted in parentheses."""
    return first_line(err).rstrip(".")


def parse_records(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of metrics.jsonl; a line cut by a ranged read is skipped."""
    records = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_metrics(
    container: Any, folder: BlobFolder, tail_bytes: int | None = None
) -> tuple[list[dict[str, Any]], datetime | None]:
    """The uploaded metrics.jsonl's records (of its last ``tail_bytes`` only, if given) and
    when it was uploaded."""
    blob = container.get_blob_client(folder.blob(METRICS_FILE))
    with storage_errors(folder.url + METRICS_FILE):
        if tail_bytes is None:
            download = blob.download_blob()
            return parse_records(download.readall()), download.properties.last_modified
        properties = blob.get_blob_properties()
        start = max(0, properties.size - tail_bytes)
        data = b""
        if properties.size:
            data = blob.download_blob(offset=start, length=properties.size - start).readall()
        if start:
            data = data.partition(b"\n")[2]  # the first line may be cut
        return parse_records(data), properties.last_modified


def train_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "train" and isinstance(r.get("step"), int)]


def number(record: dict[str, Any], key: str) -> float | None:
    """A numeric field of a record; None when absent or not a number (a bool is not one)."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def rate_key(records: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """(unit, the total-rate key): a language model's run counts tokens, an image model's
    images (the records' own keys say which: ``trainer.training.steps`` logs
    ``<unit>_per_sec_total``)."""
    unit = "tokens" if any("tokens_per_sec_total" in r for r in records) else "images"
    return unit, f"{unit}_per_sec_total"


def latest_progress(
    container: Any, folder: BlobFolder
) -> tuple[int, float | None, str, datetime | None] | None:
    """The last logged training step, its rate (all ranks), the rate's unit ("images" or
    "tokens") and when the metrics holding it were uploaded; None before the first step."""
    latest = latest_progress_and_stragglers(container, folder)
    return None if latest is None else latest[0]


def latest_progress_and_stragglers(
    container: Any, folder: BlobFolder
) -> tuple[tuple[int, float | None, str, datetime | None], list[str]] | None:
    """``latest_progress`` and the latest window's stragglers (``straggler_lines``), from one
    read of the uploaded metrics' tail; None before the first step."""
    records, uploaded = read_metrics(container, folder, TAIL_BYTES)
    train = train_records(records)
    if not train:
        return None
    unit, key = rate_key(train[-1:])
    progress = (train[-1]["step"], number(train[-1], key), unit, uploaded)
    return progress, straggler_lines(records)


def straggler_lines(records: list[dict[str, Any]]) -> list[str]:
    """The ranks the run named slower than the others in its latest window with any
    (``kind: straggler`` records, ``trainer.watch.stragglers``), one line each."""
    named = [r for r in records if r.get("kind") == "straggler" and isinstance(r.get("step"), int)]
    if not named:
        return []
    last = max(r["step"] for r in named)
    return [_straggler_line(r) for r in named if r["step"] == last]


def _straggler_line(r: dict[str, Any]) -> str:
    seconds, others = number(r, "seconds") or 0.0, number(r, "others_sec") or 0.0
    return (
        f"rank {r.get('rank')} on {r.get('host')}: {r.get('metric')} {seconds:.3f}s per step "
        f"against {others:.3f}s on the other ranks, {number(r, 'excess_of_step') or 0.0:.0%} "
        f"of a step slower (step {r['step']})"
    )


def latest_step(container: Any, folder: BlobFolder) -> tuple[int, float | None, str] | None:
    """``latest_progress`` without the upload time."""
    latest = latest_progress(container, folder)
    return None if latest is None else latest[:3]


def noise_advice(records: list[dict[str, Any]]) -> str | None:
    """The run's latest smoothed noise-scale estimate (``--noise-scale-every``), as the run's
    own summary words it; None when the run did not measure it."""
    noise = [
        r
        for r in records
        if r.get("kind") == "noise"
        and number(r, "noise_scale") is not None
        and isinstance(r.get("global_batch"), int)
    ]
    if not noise:
        return None
    return advice(noise[-1]["noise_scale"], noise[-1]["global_batch"])
