"""A node's launch log copied to Blob on AzureML (trainer/launch/log_upload.py): a copy only when
the log grew, and a storage that refuses is one warning line, tried again, never an exception
that would stop the launch."""

from __future__ import annotations

from trainer.common.blob_folder import BlobFolder
from trainer.launch import log_upload
from trainer.launch.log_upload import LogUpload

FOLDER = BlobFolder.parse("https://acct.blob.core.windows.net/logs/dev-job-1/")


class Container:
    """Refuses the first ``refusals`` uploads (as a role that has not arrived would), then
    keeps what it is given."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.blobs, self.calls = refusals, {}, 0

    def upload_blob(self, name: str, data: bytes, overwrite: bool) -> None:
        assert overwrite
        self.calls += 1
        if self.refusals:
            self.refusals -= 1
            raise PermissionError("403 AuthorizationPermissionMismatch\nmore")
        self.blobs[name] = data


def test_a_refused_copy_is_one_warning_and_the_next_one_lands(tmp_path, monkeypatch):
    container = Container(refusals=2)
    monkeypatch.setattr(log_upload, "container_client", lambda folder: container)
    log = tmp_path / "launch-10.0.0.4.log"
    log.write_text("[launch 10.0.0.4] node 1/2: starting\n")
    said: list[str] = []
    upload = LogUpload(log, FOLDER, "10.0.0.4", said.append)
    upload.sync()
    upload.sync()
    assert said == [
        "node log to https://acct.blob.core.windows.net/logs/dev-job-1/nodes/: not copied "
        "(403 AuthorizationPermissionMismatch); tried again"
    ]
    upload.sync()
    assert container.blobs == {"dev-job-1/nodes/10.0.0.4.log": log.read_bytes()}
    upload.sync()  # unchanged: not copied again
    assert container.calls == 3
    log.write_text(log.read_text() + "done\n")
    upload.sync()
    assert container.blobs["dev-job-1/nodes/10.0.0.4.log"].endswith(b"done\n")
