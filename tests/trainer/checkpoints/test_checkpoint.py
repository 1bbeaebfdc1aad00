import hashlib
import os

import pytest
import torch

from trainer.checkpoints import single_file


def state(value):
    return {"model": {"w": torch.full((4,), float(value))}, "step": value}


def test_round_trip_and_newest_first(tmp_path):
    for step in (10, 20, 30):
        single_file.save(tmp_path, step, state(step), keep=5)
    path, loaded = single_file.load_latest(tmp_path)
    assert path.name == "step-000000030.pt"
    assert loaded["step"] == 30 and loaded["schema"] == single_file.SCHEMA
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 30.0))


def test_keeps_only_the_newest_k(tmp_path):
    for step in range(1, 6):
        single_file.save(tmp_path, step, state(step), keep=2)
    assert [s for s, _ in single_file.list_checkpoints(tmp_path)] == [5, 4]
    assert len(os.listdir(tmp_path)) == 4  # pruned checkpoints take their .sha256 along


def test_crash_mid_write_leaves_the_previous_checkpoint_valid(tmp_path, monkeypatch):
    single_file.save(tmp_path, 1, state(1), keep=3)
    real_save = torch.save

    def dying_save(obj, handle):
        real_save(obj, handle)
        handle.truncate(100)  # half the bytes reached the disk, then the process died
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        single_file.save(tmp_path, 2, state(2), keep=3)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["step-000000001.pt", "step-000000001.pt.sha256"]
    _, loaded = single_file.load_latest(tmp_path)
    assert loaded["step"] == 1


def test_truncated_newest_is_skipped_for_the_previous(tmp_path, caplog):
    single_file.save(tmp_path, 1, state(1), keep=3)
    newest = single_file.save(tmp_path, 2, state(2), keep=3)
    newest.write_bytes(newest.read_bytes()[:200])
    _, loaded = single_file.load_latest(tmp_path)
    assert loaded["step"] == 1
    assert "skipping unreadable checkpoint" in caplog.text


def test_leftover_temporary_files_are_ignored_and_tidied(tmp_path):
    (tmp_path / ".step-000000009.pt.123.tmp").write_bytes(b"partial")
    assert single_file.load_latest(tmp_path) is None
    single_file.save(tmp_path, 1, state(1), keep=3)
    assert sorted(os.listdir(tmp_path)) == ["step-000000001.pt", "step-000000001.pt.sha256"]


def test_unwritable_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(single_file.CheckpointError, match="cannot write checkpoint"):
        single_file.save(blocker / "sub", 1, state(1), keep=1)


class Payload:
    """Stands in for an object whose unpickling would run code."""


def test_checkpoints_never_unpickle_code(tmp_path):
    path = tmp_path / "step-000000001.pt"
    torch.save({"schema": single_file.SCHEMA, "payload": Payload()}, path)
    # A correct checksum: the refusal must come from weights_only, not from the checksum.
    single_file.checksum_path(path).write_text(hashlib.sha256(path.read_bytes()).hexdigest())
    assert single_file.load_latest(tmp_path) is None
    with pytest.raises(Exception, match="Weights only load failed"):
        single_file.load(path)


def test_epoch_position_of_new_and_of_older_checkpoints():
    new = {"epoch_offset": 80, "epoch_world_size": 2, "step_in_epoch": 5, "world_size": 3}
    assert single_file.epoch_position(new) == (80, 2)
    # Before offsets were recorded: step_in_epoch steps of batch x accumulation x world size,
    # with the settings the checkpoint was written with.
    older = {
        "step_in_epoch": 5,
        "world_size": 2,
        "config": {"batch_size": 8, "accumulation_steps": 2},
    }
    assert single_file.epoch_position(older) == (5 * 8 * 2 * 2, 2)


def test_a_checkpoint_without_offsets_is_still_loaded(tmp_path):
    older = {**state(3), "step_in_epoch": 3, "world_size": 2, "config": {"batch_size": 4}}
    single_file.save(tmp_path, 3, older, keep=1)
    _, loaded = single_file.load_latest(tmp_path)
    assert single_file.epoch_position(loaded) == (3 * 4 * 2, 2)


def test_a_background_copy_is_not_changed_by_the_steps_that_follow():
    from trainer.engines.base import cpu_copy

    weights = torch.zeros(4)
    state = {"model": {"w": weights}, "rng": [torch.ones(2)], "step": 3}
    copy = cpu_copy(state)
    weights.add_(1.0)  # the next optimizer step, in place
    assert torch.equal(copy["model"]["w"], torch.zeros(4)) and copy["step"] == 3


def test_at_most_one_background_write_is_in_flight_and_its_error_is_one_line():
    import threading

    from trainer.checkpoints.background import BackgroundWriter

    release = threading.Event()
    writer = BackgroundWriter()
    writer.submit(release.wait)
    with pytest.raises(RuntimeError, match="already in flight"):
        writer.submit(lambda: None)
    release.set()
    assert writer.wait() is None and not writer.busy

    def fails() -> None:
        raise single_file.CheckpointError("cannot write /x/step-000000002.pt: No space left\nmore")

    writer.submit(fails)
    assert writer.wait() == "cannot write /x/step-000000002.pt: No space left"
    writer.close()
