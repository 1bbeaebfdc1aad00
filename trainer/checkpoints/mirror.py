"""Rank 0's copy of each finished checkpoint in Blob storage (``--checkpoint-mirror-url``), so
that no file server holds a run's only copy, and the resume's look there. Uploads run on a thread
of their own, at most one in flight; a failure is one warning and the next checkpoint retries.
Each checkpoint's files go up first, its manifest (every file's size and SHA-256) last: a
checkpoint without its manifest is never fetched. The newest ``--checkpoint-mirror-keep`` are
kept. See docs/trainer.md, "How checkpoints work".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
from contextlib import suppress
from pathlib import Path
from typing import Any

from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import first_line
from trainer.common.files import fsync_folder, sha256_file
from trainer.settings.train_config import TrainConfig

log = logging.getLogger(__name__)

# A checkpoint's manifest blob: ``<folder>/<checkpoint name>.mirror.json``. Azure stores no
# checksum of a blob uploaded in blocks that it checked itself (Put Block List's
# x-ms-blob-content-md5 is only stored: learn.microsoft.com/rest/api/storageservices/
# put-block-list), so the manifest carries our own SHA-256 of every file, checked on download.
MANIFEST_SUFFIX = ".mirror.json"
_MANIFEST = re.compile(r"^step-(\d{9,})\.(pt|dcp)\.mirror\.json$")
# How long the end of the run waits for the last checkpoint's upload.
FINAL_UPLOAD_SECONDS = 600.0


def checkpoint_files(path: Path) -> list[tuple[Path, str]]:
    """(file, name relative to the checkpoints folder) of a complete checkpoint: a file and its
    ``.sha256``, or every file of a sharded folder with its ``complete`` marker last."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name == "complete")
        return [(p, p.relative_to(path.parent).as_posix()) for p in files]
    sidecar = path.with_name(path.name + ".sha256")
    return [(sidecar, sidecar.name), (path, path.name)]


class CheckpointMirror:
    """Rank 0's mirror of the run's checkpoints in ``folder``, the newest ``keep`` kept."""

    def __init__(self, folder: BlobFolder, keep: int) -> None:
        self.folder, self.keep = folder, keep
        self._container: Any = None
        self._pending: Path | None = None
        self._busy = False
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="checkpoint-mirror", daemon=True)
        self.mirrored: list[str] = []  # names uploaded by this process, in order

    # ------------------------------------------------------------------ uploads
    def submit(self, path: Path) -> None:
        """Mirror the complete checkpoint ``path`` soon; a newer one replaces one not started."""
        with self._cond:
            self._pending = path
            if not self._thread.is_alive():
                self._thread.start()
            self._cond.notify_all()

    def close(self, timeout: float = FINAL_UPLOAD_SECONDS) -> None:
        """Finish the upload in flight and the one pending, waiting at most ``timeout``."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            started = self._thread.is_alive()
        if not started:
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "checkpoint mirror to %s: the last upload did not finish within %.0f s; the "
                "mirror's newest checkpoint may be an older one",
                self.folder.url,
                timeout,
            )

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stop:
                    self._cond.wait()
                path, self._pending = self._pending, None
                if path is None:
                    return
            self.upload(path)

    def upload(self, path: Path) -> bool:
        """Upload one checkpoint, its manifest last, then prune; False (one warning) on failure."""
        container, written = None, []
        try:
            container = self._client()
            entries = []
            for file, name in checkpoint_files(path):
                written.append(self.folder.blob(name))
                digest = sha256_file(file)
                with open(file, "rb") as data:
                    container.upload_blob(
                        self.folder.blob(name),
                        data,
                        length=file.stat().st_size,
                        overwrite=True,
                        metadata={"sha256": digest},
                    )
                entries.append({"name": name, "size": file.stat().st_size, "sha256": digest})
            manifest = json.dumps({"checkpoint": path.name, "files": entries}, indent=1)
            container.upload_blob(
                self.folder.blob(path.name + MANIFEST_SUFFIX), manifest.encode(), overwrite=True
            )
            self.mirrored.append(path.name)
            log.info("checkpoint mirrored: %s to %s", path.name, self.folder.url)
            self._prune(container)
        except Exception as err:  # never let storage stop training
            log.warning(
                "checkpoint mirror: cannot copy %s to %s (%s: %s); the next checkpoint retries",
                path.name,
                self.folder.url,
                type(err).__name__,
                first_line(err),
            )
            # What it wrote of a checkpoint it could not finish (the local copy pruned under a
            # slow upload, storage refusing): no manifest names those blobs, so no prune would.
            for blob in written if container is not None else []:
                with suppress(Exception):
                    container.delete_blob(blob)
            return False
        return True

    def _prune(self, container: Any) -> None:
        """Delete the mirrored checkpoints beyond the newest ``keep``: manifest first, so a
        half-deleted one is never fetched."""
        for _, _, name in self._manifests(container, None)[self.keep :]:
            blob = self.folder.blob(name + MANIFEST_SUFFIX)
            entries = json.loads(container.download_blob(blob).readall())["files"]
            container.delete_blob(blob)
            for entry in entries:
                with suppress(Exception):
                    container.delete_blob(self.folder.blob(entry["name"]))

    # ------------------------------------------------------------------ the resume
    def _manifests(self, container: Any, kind: str | None) -> list[tuple[int, str, str]]:
        """(step, kind, checkpoint name) of every mirrored checkpoint, newest first."""
        found = []
        for blob in container.list_blobs(name_starts_with=self.folder.prefix):
            rest = blob.name[len(self.folder.prefix) :]
            match = _MANIFEST.match(rest)
            if match and (kind is None or match.group(2) == kind):
                found.append((int(match.group(1)), match.group(2), rest[: -len(MANIFEST_SUFFIX)]))
        return sorted(found, reverse=True)

    def fetch_newer(self, local: Path, newest_local: int, kind: str) -> Path | None:
        """Download into ``local`` the newest verified mirrored checkpoint of ``kind`` (``pt`` or
        ``dcp``) newer than step ``newest_local``; its path, or None (why is logged)."""
        try:
            candidates = self._manifests(self._client(), kind)
        except Exception as err:
            log.warning(
                "checkpoint mirror %s unreachable (%s: %s); resuming from %s",
                self.folder.url,
                type(err).__name__,
                first_line(err),
                local,
            )
            return None
        for step, _, name in candidates:
            if step <= newest_local:
                break
            try:
                path = self._download(local, name)
            except Exception as err:
                log.warning("skipping mirrored checkpoint %s: %s", name, first_line(err))
                continue
            log.info(
                "resuming from the mirror's %s (%s), newer than the local folder's (%s)",
                name,
                self.folder.url,
                f"step {newest_local}" if newest_local >= 0 else "none",
            )
            return path
        newest = f"step {candidates[0][0]}" if candidates else "none"
        log.info(
            "checkpoint mirror %s: newest %s; resuming from %s", self.folder.url, newest, local
        )
        return None

    def _download(self, local: Path, name: str) -> Path:
        """Every file of ``name`` into a temporary folder beside it, each checked against the
        manifest, then renamed into place (the checkpoint's own file or marker last)."""
        container = self._client()
        manifest = json.loads(
            container.download_blob(self.folder.blob(name + MANIFEST_SUFFIX)).readall()
        )
        staging = local / f".{name}.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            for entry in manifest["files"]:
                target = staging / entry["name"]
                target.parent.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256()
                with open(target, "wb") as out:
                    for chunk in container.download_blob(self.folder.blob(entry["name"])).chunks():
                        digest.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != entry["sha256"]:
                    raise ValueError(f"{entry['name']} does not match its SHA-256 in the manifest")
            final = local / name
            if (staging / name).is_dir():
                shutil.rmtree(final, ignore_errors=True)  # an incomplete folder of that name
                os.replace(staging / name, final)
            else:
                os.replace(staging / f"{name}.sha256", local / f"{name}.sha256")
                os.replace(staging / name, final)
            fsync_folder(local)
            return final
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _client(self) -> Any:
        if self._container is None:
            from trainer.common.blob_client import container_client

            self._container = container_client(self.folder)
        return self._container


def build(cfg: TrainConfig, is_root: bool) -> CheckpointMirror | None:
    """Rank 0's mirror when ``--checkpoint-mirror-url`` is set; None elsewhere."""
    if not is_root or not cfg.checkpoint_mirror_url:
        return None
    mirror = CheckpointMirror(
        BlobFolder.parse(cfg.checkpoint_mirror_url), cfg.checkpoint_mirror_keep
    )
    log.info(
        "checkpoint mirror: each finished checkpoint to %s, the newest %d kept",
        mirror.folder.url,
        mirror.keep,
    )
    return mirror
