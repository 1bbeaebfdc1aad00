"""Single-file checkpoints: written by rank 0, atomically (temp file, fsync, rename), with a
``.sha256`` beside each so that changed bytes are skipped for the previous one; the newest
``keep`` are kept; and ``SingleFileCheckpointer``, the ``Checkpointer`` that writes them. The
format and why: docs/trainer.md.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoints.background import HostStaging
from trainer.checkpoints.checkpointer import CHECKPOINT_WRITTEN, Checkpointer, CheckpointError
from trainer.common.errors import first_line
from trainer.common.files import (
    fsync_folder,
    open_atomic,
    remove_partials,
    sha256_file,
    write_atomic,
)
from trainer.settings.train_config import global_batch

SCHEMA = 1
_NAME = re.compile(r"^step-(\d{9,})\.pt$")
log = logging.getLogger(__name__)


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:09d}.pt"


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, newest first."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_file():  # a folder of that name is no checkpoint
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def save(directory: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write ``state`` for ``step`` atomically, then prune to the newest ``keep`` checkpoints."""
    final = checkpoint_path(directory, step)
    previous = list_checkpoints(directory)

    def write_checksum(temporary: Path) -> None:
        write_atomic(checksum_path(final), (sha256_file(temporary) + "\n").encode())

    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open_atomic(final, before_replace=write_checksum) as handle:
            torch.save({"schema": SCHEMA, **state}, handle)
        fsync_folder(directory)
    except (OSError, RuntimeError) as err:
        # torch's zip writer reports a failed write (ENOSPC) as a RuntimeError raised while it
        # closes the file, with the OSError as its context.
        cause = os_error_in(err)
        if cause is None:
            raise
        intact = [path for _, path in previous if checksum_path(path).is_file()]
        kept = f"{intact[0].name} is intact" if intact else "there is no earlier one"
        fix = "free space or fix permissions, or use another --output-dir"
        blocking = [p for p in (final, checksum_path(final)) if p.is_dir()]
        if blocking:
            fix = f"remove the folder {blocking[0]}, which sits where the file goes"
        raise CheckpointError(
            f"cannot write checkpoint {final}: {cause.strerror}; the previous checkpoint "
            f"{kept}; {fix}"
        ) from None
    for _, old in list_checkpoints(directory)[keep:]:
        old.unlink(missing_ok=True)
        checksum_path(old).unlink(missing_ok=True)
    # Temporary files of writers that were killed mid-write are never loaded; tidy them up
    # (``.step-*.tmp`` is the temp name earlier versions wrote checkpoints under).
    for stale in directory.glob(".step-*.tmp"):
        stale.unlink(missing_ok=True)
    remove_partials(directory)
    return final


def os_error_in(err: BaseException) -> OSError | None:
    """The OSError ``err`` is or was raised while handling (its cause or context chain)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def load(path: Path) -> dict[str, Any]:
    """Load one checkpoint onto the CPU. ``weights_only`` refuses pickled code, so a file on a
    shared file system cannot run anything when it is read."""
    try:
        expected = checksum_path(path).read_text().strip()
    except OSError:
        raise ValueError("its .sha256 file is missing") from None
    if sha256_file(path) != expected:
        raise ValueError("checksum mismatch (the file changed after it was written)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("schema") != SCHEMA:
        raise ValueError(f"not a schema-{SCHEMA} checkpoint")
    return state


def load_latest(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; unreadable ones are skipped with a warning."""
    warn_misnamed(directory, _NAME, Path.is_file, "a checkpoint file")
    return newest_loadable([path for _, path in list_checkpoints(directory)], load)


def warn_misnamed(
    directory: Path, name: re.Pattern[str], usable: Callable[[Path], bool], expected: str
) -> None:
    """At resume, each entry named like a checkpoint that cannot be one (a folder, a FIFO, a
    broken link) is named in a warning line, never skipped silently: it may be the newest
    checkpoint someone moved or copied wrongly."""
    if not directory.is_dir():
        return
    for entry in sorted(directory.iterdir(), reverse=True):
        if name.match(entry.name) and not usable(entry):
            log.warning(
                "skipping %s: %s, not %s; move it out of %s",
                entry,
                _kind(entry),
                expected,
                directory,
            )


def _kind(entry: Path) -> str:
    if entry.is_symlink() and not entry.exists():
        return "a broken symbolic link"
    if entry.is_dir():
        return "a folder"
    return "a file" if entry.is_file() else "a FIFO, socket or device"


def newest_loadable(
    paths: list[Path], read: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]] | None:
    """The first of ``paths`` (newest first) that ``read`` reads, with what it read; the
    unreadable ones are skipped with a warning. Single-file and sharded checkpoints alike."""
    for path in paths:
        try:
            return path, read(path)
        except Exception as err:
            log.warning("skipping unreadable checkpoint %s: %s", path, first_line(err))
    return None


def epoch_position(state: dict[str, Any]) -> tuple[int, int]:
    """(samples of the current epoch trained, workers the epoch began on) of a training
    checkpoint. Checkpoints written before the offset was recorded were written by runs that
    never changed size within an epoch: ``step_in_epoch`` steps of ``batch_size x
    accumulation_steps x world_size`` samples (the settings they were written with)."""
    if "epoch_offset" in state:
        return int(state["epoch_offset"]), int(state["epoch_world_size"])
    saved = state["config"]
    world = int(state["world_size"])
    per_step = global_batch(
        int(saved["batch_size"]), world, int(saved.get("accumulation_steps", 1))
    )
    return int(state["step_in_epoch"]) * per_step, world


class SingleFileCheckpointer(Checkpointer):
    """Rank 0 writes the whole state to one file, atomically (``trainer.checkpoints.single_file``);
    on resume it reads it and the tensors reach the other ranks by broadcast."""

    def __init__(self, *args: Any, device: torch.device) -> None:
        super().__init__(*args)
        # Background saves copy into host tensors allocated once and reused.
        self._staging = HostStaging(self._fence, device)

    def load(self) -> tuple[Path, dict[str, Any]] | None:
        path, shared, state = self._latest()
        if shared is not None and state is not None:  # rank 0
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.dist.broadcast_training_state(self.model, self.optimizer, shared is not None)
        return None if shared is None or path is None else (path, shared)

    def _find_latest(self) -> tuple[Path, dict[str, Any]] | None:
        self._fetch_mirrored(list_checkpoints(self.folder), "pt")
        return load_latest(self.folder)

    def _start(self, step: int, trainer_state: dict[str, Any], background: bool) -> None:
        if not self.dist.is_root:
            return
        state = {
            **trainer_state,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        # In the background the next steps change the live tensors while a copy is written.
        copy = self._staging.stage(state) if background else None
        folder, keep, mirror = self.folder, self.cfg.keep_checkpoints, self._mirror

        def write() -> None:
            path = save(folder, step, state if copy is None else copy.result(), keep)
            log.info(CHECKPOINT_WRITTEN, path, os.getuid())
            if mirror is not None:
                mirror.submit(path)

        self._writes.submit(write)

    def close(self) -> None:
        super().close()
        self._staging.close()
