"""A node's launch log in Blob, for nodes that share no folder (an AzureML job): everything the
launcher prints (its lines and every worker's output, as ``RunLog`` keeps them in the node's
run folder) copied to ``<the job's folder>/nodes/<node>.log`` every ``PERIOD_S`` and once more
at the end, with the nodes' identity, where `dt-jobs logs` reads every node's. Batch keeps a
task's output itself; this is AzureML's counterpart that we control. An upload that fails is
one warning line and is tried again: a log never stops training."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from trainer.common.blob_client import container_client
from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import first_line

PERIOD_S = 30.0
FOLDER = "nodes/"  # under the job's log folder (infra.job_spec.JobSpec.log_url)
FINAL_UPLOAD_SECONDS = 60.0


def blob_of(folder: BlobFolder, node: str) -> str:
    """The blob a node's log is copied to."""
    return folder.blob(f"{FOLDER}{node}.log")


class LogUpload:
    """Copies ``path`` to the node's blob in ``folder`` until ``close()``."""

    def __init__(self, path: Path, folder: BlobFolder, node: str, say: Any) -> None:
        self.path, self.folder, self.blob = path, folder, blob_of(folder, node)
        self._say, self._warned, self._sent = say, False, -1
        self._container: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-upload", daemon=True)

    def start(self) -> LogUpload:
        self._thread.start()
        return self

    def close(self) -> None:
        """The last copy (the log is complete by now), waited for a bounded time."""
        self._stop.set()
        self._thread.join(FINAL_UPLOAD_SECONDS)

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            self.sync()
        self.sync()

    def sync(self) -> None:
        """One copy when the log grew since the last one."""
        try:
            size = self.path.stat().st_size
            if size == self._sent:
                return
            if self._container is None:
                self._container = container_client(self.folder)
            data = self.path.read_bytes()
            self._container.upload_blob(self.blob, data, overwrite=True)
            self._sent = len(data)
        except Exception as err:  # any failure: one warning, and training goes on
            if not self._warned:
                self._warned = True
                where = f"{self.folder.url}{FOLDER}"
                self._say(f"node log to {where}: not copied ({first_line(err)}); tried again")
