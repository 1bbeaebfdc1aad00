"""Corrupt, truncated, missing and unwritable checkpoints: detected, skipped, never lost."""

import contextlib
import logging
import subprocess
import sys

import pytest
import torch

from tests.conftest import tiny_config
from tests.trainer.fs_faults import file_size_limit, fill, read_only, tmpfs
from trainer.checkpoints import single_file
from trainer.checkpoints.checkpointer import CheckpointError
from trainer.checkpoints.single_file import checksum_path
from trainer.engines.local import LocalDist
from trainer.settings.flags import to_flags
from trainer.settings.train_config import DEFAULTS
from trainer.training.run import train

# The trainer runs here are single processes; none of them may leave one behind.
pytestmark = pytest.mark.usefixtures("no_leftover_processes")


@pytest.fixture
def small_disk(tmp_path):
    """A folder on a 2 MiB file system (skipped when this user cannot mount one)."""
    with tmpfs(tmp_path / "small-disk", "2m") as mount:
        yield mount


def _state(value: float) -> dict:
    return {"step": int(value), "model": {"w": torch.full((1000,), value)}}


@pytest.fixture
def two_checkpoints(tmp_path):
    folder = tmp_path / "checkpoints"
    single_file.save(folder, 1, _state(1.0), keep=5)
    newest = single_file.save(folder, 2, _state(2.0), keep=5)
    return folder, newest


def test_flipped_bytes_are_caught_by_the_checksum_and_the_previous_one_is_used(
    two_checkpoints, caplog
):
    folder, newest = two_checkpoints
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the tensor bytes: torch.load alone would not notice
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        path, state = single_file.load_latest(folder)
    assert path.name == "step-000000001.pt" and state["step"] == 1
    assert "skipping unreadable checkpoint" in caplog.text and "checksum mismatch" in caplog.text


def test_a_truncated_newest_checkpoint_falls_back(two_checkpoints, caplog):
    folder, newest = two_checkpoints
    newest.write_bytes(newest.read_bytes()[:100])
    with caplog.at_level(logging.WARNING):
        path, _ = single_file.load_latest(folder)
    assert path.name == "step-000000001.pt"


def test_a_checkpoint_without_its_checksum_is_not_trusted(two_checkpoints, caplog):
    folder, newest = two_checkpoints
    checksum_path(newest).unlink()
    with caplog.at_level(logging.WARNING):
        path, _ = single_file.load_latest(folder)
    assert path.name == "step-000000001.pt" and ".sha256 file is missing" in caplog.text


def test_no_usable_checkpoint_at_all_means_a_fresh_start(tmp_path, caplog):
    """The checkpoint judged unusable by the run itself, in this process (the command's
    "started at" is the result's start_step; its log is what caplog holds)."""
    output = tmp_path / "run"
    (output / "checkpoints").mkdir(parents=True)
    (output / "checkpoints" / "step-000000004.pt").write_bytes(b"garbage")
    config = DEFAULTS.replace(**tiny_config(output, backend="local", epochs=1))
    with caplog.at_level(logging.WARNING):
        result = train(config, LocalDist())
    assert result.start_step == 0 and result.step == 64 // 8, result
    assert "skipping unreadable checkpoint" in caplog.text


def test_full_disk_while_checkpointing_is_a_clear_error_and_keeps_the_previous(small_disk):
    folder = small_disk / "checkpoints"
    single_file.save(folder, 1, _state(1.0), keep=5)
    fill(small_disk, room=2048)
    with pytest.raises(CheckpointError) as failure:
        single_file.save(folder, 2, _state(2.0), keep=5)
    message = str(failure.value)
    assert "No space left on device" in message and "\n" not in message
    assert "step-000000001.pt is intact" in message
    assert sorted(p.name for p in folder.iterdir()) == [
        "step-000000001.pt",
        "step-000000001.pt.sha256",
    ]  # no temp files left behind
    assert single_file.load_latest(folder)[1]["step"] == 1


def test_a_write_that_fails_midway_keeps_the_previous_checkpoint(tmp_path):
    folder = tmp_path / "checkpoints"
    single_file.save(folder, 1, _state(1.0), keep=5)
    size = (folder / "step-000000001.pt").stat().st_size
    with file_size_limit(size // 2), pytest.raises(CheckpointError, match="File too large"):
        single_file.save(folder, 2, _state(2.0), keep=5)
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []
    assert single_file.load_latest(folder)[1]["step"] == 1


def test_read_only_checkpoint_folder_is_a_clear_error(two_checkpoints):
    folder, _ = two_checkpoints
    with read_only(folder), pytest.raises(CheckpointError) as failure:
        single_file.save(folder, 3, _state(3.0), keep=5)
    assert "step-000000002.pt is intact" in str(failure.value)
    assert single_file.load_latest(folder)[1]["step"] == 2


def test_trainer_on_a_full_disk_exits_1_with_one_line_and_keeps_its_checkpoint(small_disk):
    output = small_disk / "run"
    config = tiny_config(output, backend="local", epochs=2, checkpoint_every=3)
    # The first 3 steps (and their checkpoint) in process: only the run that meets the full
    # disk needs to be the command.
    first = train(DEFAULTS.replace(**config, run_steps=3), LocalDist())
    assert first.step == 3, first
    before = single_file.list_checkpoints(output / "checkpoints")
    assert [step for step, _ in before] == [3]
    args = [sys.executable, "-m", "trainer", *to_flags(config)]
    # Room for metrics and TensorBoard events (a few KiB), not for a checkpoint (about 60 KiB).
    fill(small_disk, room=32 * 1024)
    second = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert second.returncode == 1
    errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0], second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    assert single_file.list_checkpoints(output / "checkpoints") == before
    assert single_file.load_latest(output / "checkpoints") is not None


@pytest.mark.parametrize("blocker", ["a file", "a read-only folder"])
def test_an_output_folder_the_user_cannot_write_is_one_line_before_training(tmp_path, blocker):
    """The run folder on a share the task user cannot write (a root-owned folder under
    root_squash) or a file in its way: exit 1 with one line, nothing trained."""
    if blocker == "a file":
        (tmp_path / "runs").write_text("not a folder")
        output, context = tmp_path / "runs" / "dev" / "run1", contextlib.nullcontext()
    else:
        (tmp_path / "runs").mkdir()
        output, context = tmp_path / "runs" / "dev" / "run1", read_only(tmp_path / "runs")
    args = [sys.executable, "-m", "trainer", "--backend", "local", *to_flags(tiny_config(output))]
    with context:
        result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: output_dir={output}: cannot create or write it as uid ")
    assert "Traceback" not in result.stderr and not output.exists()


@pytest.mark.parametrize("blocked", ["checkpoint", "sidecar"])
def test_a_folder_where_the_checkpoint_or_its_sidecar_goes_is_named_as_the_fix(
    two_checkpoints, blocked
):
    folder, _ = two_checkpoints
    final = single_file.checkpoint_path(folder, 3)
    (final if blocked == "checkpoint" else single_file.checksum_path(final)).mkdir()
    with pytest.raises(CheckpointError) as failure:
        single_file.save(folder, 3, _state(3.0), keep=5)
    message = str(failure.value)
    assert "step-000000002.pt is intact" in message and "remove the folder" in message
    assert single_file.load_latest(folder)[1]["step"] == 2


def test_a_folder_named_like_the_newest_checkpoint_is_not_called_intact(two_checkpoints):
    folder, _ = two_checkpoints
    (single_file.checkpoint_path(folder, 9)).mkdir()  # not a checkpoint: never listed
    assert [s for s, _ in single_file.list_checkpoints(folder)] == [2, 1]
    with read_only(folder), pytest.raises(CheckpointError) as failure:
        single_file.save(folder, 3, _state(3.0), keep=5)
    assert "step-000000002.pt is intact" in str(failure.value)
