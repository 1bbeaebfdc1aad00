"""A job's code snapshot in the stack's storage: ``CodeUpload``, a dynamic resource that puts
``<sha256>.tar.gz`` (infra.code_snapshot) into the ``code`` container once per hash, with the
deployer's credential (infra.credentials). Its inputs are the folder, the hash and the blob
endpoint, never the bytes: the provider builds the snapshot again from the folder and uploads
it only if the hash is the one the preview showed. Azure SDK imports stay inside functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult

from infra.dynamic import OneLineError, Provider, changed_inputs

CONTAINER = "code"  # infra.storage.CONTAINERS; trainer.code_folder.CONTAINER reads it
INPUT_KEYS = ("folder", "sha256", "blob_endpoint")


class CodeUploadError(OneLineError):
    """The snapshot could not be uploaded; one line naming the folder and the fix."""


def upload(folder: str, sha256: str, blob_endpoint: str) -> str:
    """The blob's URL once it holds the snapshot of ``folder`` whose hash is ``sha256``. An
    existing blob of that name is the same bytes (the name is their hash): left as it is."""
    from azure.core.exceptions import AzureError, ResourceExistsError
    from azure.storage.blob import BlobClient

    from infra import credentials
    from infra.code_snapshot import SnapshotError, snapshot
    from infra.config import REPO

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
    try:
        blob.upload_blob(snap.data, overwrite=False)
    except ResourceExistsError:
        pass
    except AzureError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CodeUploadError(
            f"uploading jobs.<name>.code={folder!r} to {blob.url} failed: {first}; the "
            "deployer needs Storage Blob Data Contributor on the code container"
        ) from None
    return blob.url


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
