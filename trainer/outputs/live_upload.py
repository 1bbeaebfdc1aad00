"""Rank 0's live copy of the run's record in Blob storage, readable outside the private network.
Why it is built this way: docs/internals.md, `trainer/outputs/live_upload.py`."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.common.blob_client import container_client
from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import first_line
from trainer.common.grant_wait import CONTRIBUTOR, PENDING, is_pending, missing_role
from trainer.settings.train_config import TrainConfig

log = logging.getLogger(__name__)

# How long the end of the run waits for the last upload before it gives up with a warning.
FINAL_UPLOAD_SECONDS = 120.0


def record_files(output_dir: Path) -> list[tuple[Path, str]]:
    """The run's record: (local file, name relative to the folder URL), metrics first."""
    files = [(output_dir / "metrics.jsonl", "metrics.jsonl")]
    tensorboard = output_dir / "tensorboard"
    if tensorboard.is_dir():
        files += [
            (path, path.relative_to(output_dir).as_posix())
            for path in sorted(tensorboard.rglob("*"))
            if path.is_file()
        ]
    return files


class LiveUploader:
    """Copies the run's record to ``folder`` every ``period_s`` seconds until ``close()``."""

    def __init__(self, output_dir: Path, folder: BlobFolder, period_s: float) -> None:
        self.output_dir, self.folder, self.period_s = output_dir, folder, period_s
        self._sent: dict[str, tuple[int, int]] = {}  # blob name -> (size, mtime_ns) sent
        self._container: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-upload", daemon=True)
        self.uploads = 0  # blobs written so far

    def start(self) -> LiveUploader:
        self._thread.start()
        return self

    def close(self, timeout: float = FINAL_UPLOAD_SECONDS) -> None:
        """The last upload (after the run's files are closed), waited for at most ``timeout``."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "live upload to %s: the last upload did not finish within %.0f s; the blobs "
                "may miss the run's last records",
                self.folder.url,
                timeout,
            )

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sync()
        self.sync()

    def sync(self) -> bool:
        """Upload what changed; False (and one warning line) when something failed."""
        try:
            for path, name in record_files(self.output_dir):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue  # not written yet
                seen = (stat.st_size, stat.st_mtime_ns)
                blob = self.folder.blob(name)
                if self._sent.get(blob) == seen:
                    continue
                # The whole file as it is now: metrics.jsonl grows while we read, and a block
                # blob's length must be known. A longer file than ``seen`` is sent again later.
                data = path.read_bytes()
                self._client().upload_blob(blob, data, overwrite=True)
                self._sent[blob] = seen
                self.uploads += 1
        except Exception as err:  # never let storage stop training
            reason = first_line(err)
            if is_pending(err):
                reason = (
                    f"{PENDING}: {missing_role(CONTRIBUTOR)} yet; a new role assignment takes "
                    f"up to 30 min to propagate"
                )
            minutes = self.period_s / 60
            log.warning(
                "live upload to %s failed (%s: %s); %s",
                self.folder.url,
                type(err).__name__,
                reason,
                "giving up: the run has ended"
                if self._stop.is_set()
                else f"retrying in {minutes:g} min",
            )
            return False
        return True

    def _client(self) -> Any:
        if self._container is None:
            self._container = container_client(self.folder)
        return self._container


@contextlib.contextmanager
def uploading(cfg: TrainConfig, enabled: bool) -> Iterator[LiveUploader | None]:
    """Live upload while the block runs (when ``enabled`` and configured), the last one after."""
    if not enabled or not cfg.metrics_upload_url:
        yield None
        return
    uploader = LiveUploader(
        Path(cfg.output_dir),
        BlobFolder.parse(cfg.metrics_upload_url),
        cfg.metrics_upload_minutes * 60,
    ).start()
    log.info(
        "live upload: metrics.jsonl and tensorboard/ to %s every %g min",
        uploader.folder.url,
        cfg.metrics_upload_minutes,
    )
    try:
        yield uploader
    finally:
        uploader.close()
