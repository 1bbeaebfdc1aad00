"""``upload`` (local shards -> Blob) and ``stage`` (Blob -> NFS or a node's local NVMe).

Both authenticate with ``DefaultAzureCredential`` (a managed identity on the nodes, the Azure
CLI login on a laptop); there are no keys or SAS tokens in config. Every shard is checked
against the manifest's SHA-256: before it is uploaded, and while it is downloaded. A download
goes to a hidden temp name and is renamed only when its checksum matches, so no partial shard
is ever visible; a rerun skips shards that are already verified, which makes an interrupted
transfer resumable. The manifest travels last: its presence means the shard set is complete.
While the identity's role assignment is still propagating (up to 30 minutes; Storage answers 403
AuthorizationPermissionMismatch) every call waits it out (``trainer.common.grant_wait``), then fails
in one line naming the missing role.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.common.files import (
    OutputError,
    ensure_writable_folder,
    partial_path,
    remove_partials,
    write_atomic,
)
from trainer.common.grant_wait import CONTRIBUTOR, READER, GrantMissing, GrantWait
from trainer.data.errors import DataError
from trainer.data.manifest import MANIFEST_NAME, Manifest, ShardEntry, shard_is_valid

if TYPE_CHECKING:
    from trainer.common.azure_sdk import ContainerClient

DOWNLOAD_ATTEMPTS = 2


@dataclass(frozen=True)
class TransferResult:
    copied: int
    skipped: int
    bytes_copied: int

    @classmethod
    def of(cls, copied_bytes: list[int]) -> TransferResult:
        """From the bytes each shard's transfer copied (0: already there and verified)."""
        copied = sum(1 for size in copied_bytes if size)
        return cls(copied, len(copied_bytes) - copied, sum(copied_bytes))


def container_client(account_url: str, container: str) -> ContainerClient:
    """A container client authenticated with Entra ID (managed identity, CLI login, ...)."""
    from trainer.common.azure_sdk import ContainerClient, DefaultAzureCredential

    if not account_url.startswith("https://"):
        raise DataError(
            f"account_url={account_url}: use the https:// blob endpoint of the storage account"
        )
    return ContainerClient(account_url, container, credential=DefaultAzureCredential())


def _blob_name(prefix: str, name: str) -> str:
    return f"{prefix.strip('/')}/{name}" if prefix.strip("/") else name


@contextlib.contextmanager
def _azure_errors(where: str) -> Iterator[None]:
    """Turn the SDK's exceptions into one-line DataErrors naming what failed."""
    from trainer.common.azure_sdk import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
    )

    try:
        yield
    except GrantMissing as err:
        raise DataError(str(err)) from None
    except ResourceNotFoundError as err:
        raise DataError(f"{where}: not found ({err.reason}); upload the dataset first") from None
    except ClientAuthenticationError as err:
        raise DataError(
            f"{where}: cannot authenticate ({str(err).splitlines()[0]}); log in with "
            f"`az login` or give the node an identity with Storage Blob Data Reader"
        ) from None
    except (HttpResponseError, ServiceRequestError) as err:
        raise DataError(f"{where}: {str(err).splitlines()[0]}") from None


def upload(
    folder: Path,
    container: ContainerClient,
    prefix: str,
    *,
    parallel: int = 8,
    log: Callable[[str], None] = print,
    grant_wait: GrantWait | None = None,
) -> TransferResult:
    """Upload a prepared dataset; blobs whose size and recorded SHA-256 match are skipped.
    ``grant_wait``: how long a refusal for want of the role is waited out (default: 30 min)."""
    wait = grant_wait or GrantWait(CONTRIBUTOR, log=log)
    manifest = Manifest.load(folder)
    _check_local_shards(folder, manifest, parallel)
    where = f"{container.url}/{prefix}"
    with _azure_errors(where):
        existing = wait.call(
            lambda: {
                blob.name: blob
                for blob in container.list_blobs(name_starts_with=prefix, include=["metadata"])
            },
            where,
        )

    def send(shard: ShardEntry) -> int:
        name = _blob_name(prefix, shard.name)
        if _already_uploaded(existing.get(name), shard):
            return 0
        with _azure_errors(f"{container.url}/{name}"):
            wait.call(
                lambda: _put_shard(container, name, folder / shard.name, shard),
                f"{container.url}/{name}",
            )
        return shard.bytes

    with ThreadPoolExecutor(parallel) as pool:
        sent = list(pool.map(send, manifest.shards))
    manifest_blob = _blob_name(prefix, MANIFEST_NAME)
    with _azure_errors(where):  # the manifest lands last: a reader never sees a partial set
        wait.call(
            lambda: container.upload_blob(
                manifest_blob, manifest.to_json().encode(), overwrite=True
            ),
            f"{container.url}/{manifest_blob}",
        )
    result = TransferResult.of(sent)
    log(
        f"uploaded {result.copied} shards ({result.bytes_copied / 2**20:.1f} MiB), "
        f"{result.skipped} already there, to {where}"
    )
    return result


def _check_local_shards(folder: Path, manifest: Manifest, parallel: int) -> None:
    """Every shard matches the manifest before anything is sent."""
    with ThreadPoolExecutor(parallel) as pool:
        valid = list(pool.map(lambda s: shard_is_valid(folder / s.name, s), manifest.shards))
    for shard, ok in zip(manifest.shards, valid, strict=True):
        if not ok:
            raise DataError(
                f"shard {folder / shard.name} does not match {MANIFEST_NAME} (size or SHA-256): "
                f"rerun `dt-data prepare`"
            )


def _already_uploaded(blob: Any, shard: ShardEntry) -> bool:
    return bool(
        blob and blob.size == shard.bytes and (blob.metadata or {}).get("sha256") == shard.sha256
    )


def _put_shard(container: ContainerClient, name: str, path: Path, shard: ShardEntry) -> None:
    with open(path, "rb") as file:
        # A block blob becomes visible only when all its blocks commit: never partial.
        container.upload_blob(
            name,
            file,
            length=shard.bytes,
            overwrite=True,
            metadata={"sha256": shard.sha256},
            validate_content=True,
            max_concurrency=4,
        )


def _download(
    container: ContainerClient, name: str, target: Path, shard: ShardEntry, wait: GrantWait
) -> None:
    """Download ``name`` to ``target`` through a temp file; rename only when the SHA-256 matches;
    one retry, then a clear failure."""
    got = ""
    where = f"{container.url}/{name}"
    for _ in range(DOWNLOAD_ATTEMPTS):
        # The shared temp-name scheme, per thread: remove_partials tidies what a kill leaves.
        temp = partial_path(target)
        temp = temp.with_name(f"{temp.name}-{threading.get_ident()}")
        try:
            with _azure_errors(where):
                got = wait.call(lambda: _fetch(container, name, temp), where)  # noqa: B023
            if got == shard.sha256 and temp.stat().st_size == shard.bytes:
                os.replace(temp, target)
                return
        finally:
            temp.unlink(missing_ok=True)
    raise DataError(
        f"shard {name}: SHA-256 {got[:12]}... after {DOWNLOAD_ATTEMPTS} downloads does not match "
        f"the manifest's {shard.sha256[:12]}...: re-upload the dataset"
    )


def _fetch(container: ContainerClient, name: str, temp: Path) -> str:
    """Write blob ``name`` to ``temp`` from its start (a retry rewrites it), synced; its SHA-256."""
    digest = hashlib.sha256()
    with open(temp, "wb") as file:
        for chunk in container.download_blob(name, max_concurrency=4).chunks():
            digest.update(chunk)
            file.write(chunk)
        file.flush()
        os.fsync(file.fileno())
    return digest.hexdigest()


def stage(
    container: ContainerClient,
    prefix: str,
    dest: Path,
    *,
    parallel: int = 8,
    log: Callable[[str], None] = print,
    grant_wait: GrantWait | None = None,
) -> TransferResult:
    """Copy a dataset from Blob to ``dest``, verified; resumable; the manifest lands last.
    ``grant_wait``: how long a refusal for want of the role is waited out (default: 30 min)."""
    wait = grant_wait or GrantWait(READER, log=log)
    manifest_blob = _blob_name(prefix, MANIFEST_NAME)
    where = f"{container.url}/{manifest_blob}"
    with _azure_errors(where):
        text = wait.call(lambda: container.download_blob(manifest_blob).readall().decode(), where)
    manifest = Manifest.from_json(text, where)
    try:
        fetched = _stage_into(container, prefix, dest, manifest, text, parallel, wait)
    except OSError as err:
        # Downloads go to temp names that are removed when a write fails, and the manifest
        # lands last: nothing left here passes for a complete, staged dataset.
        raise OutputError.of(err, dest) from None
    result = TransferResult.of(fetched)
    log(
        f"staged {result.copied} shards ({result.bytes_copied / 2**20:.1f} MiB), "
        f"{result.skipped} already verified, into {dest}"
    )
    return result


def _stage_into(
    container: ContainerClient,
    prefix: str,
    dest: Path,
    manifest: Manifest,
    text: str,
    parallel: int,
    wait: GrantWait,
) -> list[int]:
    """Fetch what ``dest`` lacks, drop what the manifest does not list, then write the manifest
    (``text``); the bytes each shard's transfer copied."""
    ensure_writable_folder(dest)
    local_manifest = dest / MANIFEST_NAME
    if local_manifest.exists() and local_manifest.read_text() != text:
        local_manifest.unlink()  # a different dataset is arriving: no longer complete
    remove_partials(dest)

    def fetch(shard: ShardEntry) -> int:
        target = dest / shard.name
        if shard_is_valid(target, shard):
            return 0
        _download(container, _blob_name(prefix, shard.name), target, shard, wait)
        return shard.bytes

    with ThreadPoolExecutor(parallel) as pool:
        fetched = list(pool.map(fetch, manifest.shards))
    listed = {shard.name for shard in manifest.shards}
    for stale in dest.glob("*.tar"):
        if stale.name not in listed:
            stale.unlink()
    write_atomic(local_manifest, text.encode())
    return fetched


def stage_args(account_url: str, container: str, prefix: str, dest: str) -> list[str]:
    """The command that stages a dataset, e.g. as a Batch job preparation task."""
    args = ["python", "-m", "trainer.data", "stage", "--account-url", account_url]
    return [*args, "--container", container, "--prefix", prefix, "--dest", dest]
