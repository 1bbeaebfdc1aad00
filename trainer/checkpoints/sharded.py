"""Sharded checkpoints (``--backend fsdp``): a folder ``step-000001200.dcp/`` of every rank's
shards (torch.distributed.checkpoint, readable on any number of ranks), rank 0's
``trainer_state.pt`` and, last, the ``complete`` marker without which the folder is never loaded;
and ``ShardedCheckpointer``, the ``Checkpointer`` that writes them. The format and why:
docs/trainer.md.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoints.background import snapshot_unguarded
from trainer.checkpoints.checkpointer import CHECKPOINT_WRITTEN, Checkpointer, CheckpointError
from trainer.checkpoints.single_file import SCHEMA, newest_loadable, os_error_in, warn_misnamed
from trainer.common.errors import first_line
from trainer.common.files import fsync_folder, write_atomic
from trainer.engines.base import cpu_copy

_NAME = re.compile(r"^step-(\d{9,})\.dcp$")
COMPLETE = "complete"
TRAINER_STATE = "trainer_state.pt"
log = logging.getLogger(__name__)


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:09d}.dcp"


def _step_folders(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), e) for e in directory.iterdir() if (m := _NAME.match(e.name))]
    return sorted(found, reverse=True)


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete sharded checkpoint, newest first."""
    return [(step, path) for step, path in _step_folders(directory) if is_complete(path)]


def is_complete(path: Path) -> bool:
    return path.is_dir() and (path / COMPLETE).is_file()


def background_stager(device: torch.device) -> Any:
    """DCP's stager for a run's background saves (``DefaultStager``, torch 2.13): it copies the
    shards on a thread of its own, so the copy overlaps the next step (``StepFence`` makes the
    step wait for it), into host buffers it caches by source storage and reuses at every save
    (pinned, with non-blocking copies, on a GPU). Shared memory only serves a process-based
    writer; ours is a thread. Closed at the end of the run."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    gpu = device.type == "cuda"
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=gpu,
            use_shared_memory=False,
            use_async_staging=True,
            use_non_blocking_copy=gpu,
        )
    )


def start_writing(
    path: Path, tensors: dict[str, Any], background: tuple[Any, Any] | None
) -> tuple[Future[Any], Future[Any]] | None:
    """Every rank: write this rank's shards of ``tensors`` into ``path`` (a collective). With
    ``background``, a (process group, stager) pair, DCP stages the shards to host memory on a
    thread and then writes them, its collectives on that group of their own so that they never
    interleave with training's: returns the futures of the copy and of the write. Otherwise
    returns None once written."""
    import torch.distributed.checkpoint as dcp

    if background is None:
        dcp.save(tensors, checkpoint_id=path)
        return None
    group, stager = background
    if torch.accelerator.is_available():
        # The stager's copies run on a stream of their own, which does not wait for the
        # compute stream: the last step's updates must have landed.
        torch.accelerator.synchronize()
    response = dcp.async_save(tensors, checkpoint_id=path, process_group=group, async_stager=stager)
    return response.staging_completion, response.upload_completion


def prepare_folder(path: Path) -> None:
    """Rank 0, before the shards are written: an empty folder for them (an incomplete folder
    of the same step, left by a crash, is removed first)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def complete(path: Path, trainer_state: dict[str, Any], keep: int) -> None:
    """Rank 0, after every rank's shards are written: the trainer state, then the marker that
    makes the folder a checkpoint, then pruning to the newest ``keep``."""
    buffer = io.BytesIO()
    torch.save({"schema": SCHEMA, **trainer_state}, buffer)
    write_atomic(path / TRAINER_STATE, buffer.getvalue())
    fsync_folder(path)
    write_atomic(path / COMPLETE, json.dumps({"step": trainer_state["step"]}).encode())
    fsync_folder(path.parent)
    newest = list_checkpoints(path.parent)
    for _, old in newest[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    # Incomplete folders (a save that crashed before its marker) are never loaded; tidy them.
    for step, folder in _step_folders(path.parent):
        if not is_complete(folder) and folder != path:
            shutil.rmtree(folder, ignore_errors=True)
            log.info("removed incomplete sharded checkpoint %s (step %d)", folder, step)


def load_latest_trainer_state(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint whose trainer state reads, with that state."""
    warn_misnamed(directory, _NAME, Path.is_dir, "a sharded checkpoint's folder")
    folders = [path for _, path in list_checkpoints(directory)]
    return newest_loadable(folders, read_trainer_state)


def read_trainer_state(path: Path) -> dict[str, Any]:
    """The non-tensor part of a complete checkpoint (any rank may read it)."""
    state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("schema") != SCHEMA:
        raise ValueError(f"{TRAINER_STATE} is not a schema-{SCHEMA} trainer state")
    return state


def read_shards(path: Path, tensors: dict[str, Any]) -> None:
    """Every rank: fill ``tensors`` (this rank's shards, as the model and optimizer are sharded
    now) from the checkpoint, whatever number of ranks wrote it (a collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.load(tensors, checkpoint_id=path)


def save_error(path: Path, err: BaseException) -> CheckpointError:
    """One line for a failed sharded save, naming the folder."""
    cause = os_error_in(err)
    reason = cause.strerror if cause else first_line(err)
    return CheckpointError(
        f"cannot write sharded checkpoint {path}: {reason or type(err).__name__}; the previous "
        "complete checkpoint is kept; free space or fix permissions, or use another --output-dir"
    )


class ShardedCheckpointer(Checkpointer):
    """Every rank writes and reads its own shards (``trainer.checkpoints.sharded``, DCP); rank 0
    adds the trainer's entries and the marker that completes the folder."""

    def __init__(self, *args: Any, device: torch.device) -> None:
        super().__init__(*args)
        # Background saves copy the shards with DCP's stager, on a thread of its own.
        self._stager = background_stager(device) if self.cfg.checkpoint_async else None

    def load(self) -> tuple[Path, dict[str, Any]] | None:
        path, shared, _ = self._latest()
        if shared is None or path is None:
            return None
        self._read_shards(path)
        return path, shared

    def _find_latest(self) -> tuple[Path, dict[str, Any]] | None:
        self._fetch_mirrored(list_checkpoints(self.folder), "dcp")
        return load_latest_trainer_state(self.folder)

    def _tensors(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def _read_shards(self, path: Path) -> None:
        """Every rank: its shards of the model and optimizer from ``path``, resharded by DCP
        when another number of ranks wrote them."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        tensors = self._tensors()
        read_shards(path, tensors)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=tensors["model"],
            optim_state_dict=tensors["optimizer"],
        )

    def _start(self, step: int, trainer_state: dict[str, Any], background: bool) -> None:
        path = checkpoint_path(self.folder, step)
        error = None
        if self.dist.is_root:
            try:
                prepare_folder(path)
            except OSError as err:
                error = str(save_error(path, err))
        self._agree(error)
        pending = None
        try:
            tensors, staging = self._tensors(), None
            if background:
                # What the optimizer's step does not change (buffers forward updates) is copied
                # now; DCP copies the rest to host memory while the next step runs.
                tensors = snapshot_unguarded(tensors, self._fence.guarded())
                staging = (self.dist.background_group, self._stager)
            pending = start_writing(path, tensors, staging)
            if pending is not None:
                self._fence.hold(pending[0])
        except Exception as err:
            error = str(save_error(path, err))
        self._agree(error)
        self._writes.submit(self._completion(path, pending, trainer_state))

    def _completion(
        self, path: Path, pending: tuple[Any, Any] | None, trainer_state: dict[str, Any]
    ) -> Callable[[], None]:
        """The write's end: every rank's shards, then rank 0's trainer state and marker."""
        state = cpu_copy(trainer_state) if self.dist.is_root else None
        keep, mirror = self.cfg.keep_checkpoints, self._mirror

        def write() -> None:
            try:
                if pending is not None:
                    pending[1].result()  # every rank's shards and DCP's metadata are written
                if state is not None:  # rank 0: the trainer state, then the marker
                    complete(path, state, keep)
                    log.info(CHECKPOINT_WRITTEN, path, os.getuid())
                    if mirror is not None:
                        mirror.submit(path)
            except Exception as err:
                raise save_error(path, err) from None

        return write

    def close(self) -> None:
        super().close()
        if self._stager is not None:
            self._stager.close()
