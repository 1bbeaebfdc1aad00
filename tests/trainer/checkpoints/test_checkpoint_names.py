"""At resume, whatever sits at a checkpoint's name and cannot be read as one (a folder, a FIFO,
a broken link, garbage bytes) is named in one warning line and the previous checkpoint is used;
nothing named like a checkpoint is skipped silently."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from trainer.checkpoints import sharded as sharded_checkpoint
from trainer.checkpoints import single_file


def _state(step: int) -> dict:
    return {"step": step, "model": {"w": torch.full((10,), float(step))}}


def _make(kind: str, path) -> str:
    """Put ``kind`` at ``path``; return the words the warning must say about it."""
    if kind == "folder":
        path.mkdir()
        return "a folder"
    if kind == "fifo":  # opening it to read would wait for a writer for ever
        os.mkfifo(path)
        return "a FIFO, socket or device"
    if kind == "broken link":
        path.symlink_to(path.parent / "gone")
        return "a broken symbolic link"
    path.write_bytes(b"\x00garbage" * 100)
    return "skipping unreadable checkpoint"


@pytest.mark.parametrize("kind", ["folder", "fifo", "broken link", "garbage"])
def test_an_unusable_entry_at_the_newest_name_is_named_and_the_previous_one_used(
    tmp_path, caplog, kind
):
    folder = tmp_path / "checkpoints"
    single_file.save(folder, 1, _state(1), keep=5)
    newest = single_file.checkpoint_path(folder, 2)
    words = _make(kind, newest)
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoints.single_file"):
        path, state = single_file.load_latest(folder)
    assert state["step"] == 1 and path == single_file.checkpoint_path(folder, 1)
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert str(newest) in line and words in line and "\n" not in line


@pytest.mark.parametrize("kind", ["file", "fifo", "broken link"])
def test_an_entry_at_a_sharded_checkpoints_name_that_is_no_folder_is_named(tmp_path, caplog, kind):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    entry = sharded_checkpoint.checkpoint_path(folder, 3)
    words = "a file" if kind == "file" else _make(kind, entry)
    if kind == "file":
        entry.write_bytes(b"not a folder")
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoints.single_file"):
        assert sharded_checkpoint.load_latest_trainer_state(folder) is None
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert str(entry) in line and words in line and "sharded checkpoint's folder" in line
