"""A job's code snapshot in the stack's storage: ``CodeUpload``, a dynamic resource that puts
``<sha256>.tar.gz`` (infra.code_snapshot) into the ``code`` container once per hash, with the
deployer's credential (infra.credentials), which the stack grants ``DEPLOYER_ROLE`` on that
container alone; the grant's propagation is waited out, and the account's firewall must admit
the deployer's address (storageAllowedIps). Its inputs are the folder, the hash and the blob
endpoint, never the bytes: the provider builds the snapshot again from the folder and uploads
it only if the hash is the one the preview showed. Azure SDK imports stay inside functions.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult

from infra.dynamic import OneLineError, Provider, changed_inputs
from trainer.common.errors import first_line
from trainer.common.grant_wait import (
    CONTRIBUTOR,
    FIREWALL_REFUSAL,
    PENDING,
    GrantMissing,
    GrantWait,
    is_firewall_refusal,
)

CONTAINER = "code"  # infra.storage.CONTAINERS; trainer.launch.code_folder.CONTAINER reads it
INPUT_KEYS = ("folder", "sha256", "blob_endpoint")
# The deployer's one data role, on the code container (infra.stack): it writes the snapshots.
DEPLOYER_ROLE = CONTRIBUTOR
# Storage's refusal of an address its firewall does not admit, whatever the credential (403;
# SupportArticles-docs storage-troubleshoot-403-errors.md, read 2026-11-28).


class CodeUploadError(OneLineError):
    """The snapshot could not be uploaded; one line naming the folder and the fix."""


def grant_wait() -> GrantWait:
    """Waits out the deployer's new role on the code container (up to 30 minutes to reach
    Storage), one warning per wait in the `pulumi up` output."""
    return GrantWait(DEPLOYER_ROLE, log=pulumi.log.warn)


def upload(folder: str, sha256: str, blob_endpoint: str) -> str:
    """The blob's URL once it holds the snapshot of ``folder`` whose hash is ``sha256``. An
    existing blob of that name is the same bytes (the name is their hash): left as it is."""
    from infra import credentials
    from infra.code_snapshot import SnapshotError, snapshot
    from infra.settings.values import REPO
    from trainer.common.azure_sdk import AzureError, BlobClient, HttpResponseError

    try:
        snap = snapshot(folder, REPO)
    except SnapshotError as err:
        raise CodeUploadError(f"jobs.<name>.code={folder!r}: {err}") from None
    if snap.sha256 != sha256:
        raise CodeUploadError(
            f"jobs.<name>.code={folder!r}: its tracked files changed since the preview "
            f"(sha256 {snap.sha256[:12]}..., planned {sha256[:12]}...); run pulumi up again"
        )
    blob = BlobClient(blob_endpoint, CONTAINER, snap.blob_name, credential=credentials.credential())
    where = f"uploading jobs.<name>.code={folder!r} to {blob.url}"
    try:
        grant_wait().call(lambda: _put(blob, snap.data), where)
    except GrantMissing:
        raise CodeUploadError(
            f"{where}: Storage still refuses the deployer ({PENDING}) after 30 min: it "
            f"lacks {DEPLOYER_ROLE} on the code container, which the stack assigns; check "
            "that the assignment exists, then run `pulumi up` again"
        ) from None
    except HttpResponseError as err:
        if is_firewall_refusal(err):
            raise CodeUploadError(
                f"{where}: the storage account's firewall refused this machine's address "
                f"(403 {FIREWALL_REFUSAL}); add it to storageAllowedIps (pulumi config set "
                "--path 'storageAllowedIps[0]' <address>), run `pulumi up` from a machine "
                "whose address is there, or drop the job's code"
            ) from None
        raise CodeUploadError(f"{where} failed: {first_line(err)}") from None
    except AzureError as err:
        raise CodeUploadError(f"{where} failed: {first_line(err)}") from None
    return blob.url


def _put(blob: Any, data: bytes) -> None:
    """Writes ``data`` unless the blob exists (the same bytes: its name is their hash)."""
    from trainer.common.azure_sdk import ResourceExistsError

    with contextlib.suppress(ResourceExistsError):
        blob.upload_blob(data, overwrite=False)


class CodeUploadProvider(Provider):
    """Uploads on create; a new hash or account is a new resource. Keep this class's name and
    module: stacks refer to them."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        url = upload(props["folder"], props["sha256"], props["blob_endpoint"])
        return CreateResult(props["sha256"], {**props, "url": url})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = changed_inputs(olds, news, ("url",))
        replaces = [key for key in changed if key in ("sha256", "blob_endpoint")]
        return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> Any:
        from pulumi.dynamic import UpdateResult

        return UpdateResult({**news, "url": _olds.get("url")})

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # Kept: a running or retried task of an older job may still fetch it, and the blob is
        # the same bytes for every job and stack that names this hash.
        return None


@dataclass(frozen=True)
class CodeUploadArgs:
    folder: str
    sha256: str
    blob_endpoint: pulumi.Input[str]


class CodeUpload(pulumi.dynamic.Resource):
    url: pulumi.Output[str]

    def __init__(
        self, name: str, args: CodeUploadArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props = {key: getattr(args, key) for key in INPUT_KEYS}
        super().__init__(CodeUploadProvider(), name, {**props, "url": None}, opts)
