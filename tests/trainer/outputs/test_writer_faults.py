"""The trainer's in-process writers on real failing file systems (tests/trainer/fs_faults.py): a
full, read-only or immutable output folder, or a file where the folder goes, is one line naming the
path and the fix (exit 1 from a command), and nothing is left that a reader could take for
complete output."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_config
from tests.trainer.fs_faults import FAULTS, faulty_output, fill, leftovers, tmpfs
from trainer.checkpoints import single_file
from trainer.checkpoints.checkpointer import CheckpointError
from trainer.common.files import OutputError
from trainer.data.__main__ import main as data_main
from trainer.engines.local import LocalDist
from trainer.outputs import results
from trainer.outputs.metrics import MetricsWriter
from trainer.settings.flags import to_flags
from trainer.settings.train_config import DEFAULTS
from trainer.training.run import train

# What each fault's one line must say: the reason and the first words of its fix.
EXPECTED = {
    "full": ("No space left on device", "free space"),
    "read-only": ("Read-only file system", "remount it read-write"),
    "immutable": ("Operation not permitted", "chattr -i"),
    "file-in-the-way": ("Not a directory", "a file sits where a folder goes"),
}


def _one_line(capsys, code: int) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@pytest.mark.parametrize("fault", FAULTS)
def test_prepare_text_into_a_faulty_folder_is_one_line_exit_1(tmp_path, capsys, fault):
    src = tmp_path / "text.txt"
    # Enough tokens (bytes) to overrun the room a full disk leaves, in several shards.
    src.write_text("the quick brown fox jumps over the lazy dog\n" * 8000)
    with faulty_output(tmp_path, fault, room=32 * 1024) as out:
        with pytest.raises(SystemExit) as exit_:
            data_main(["prepare-text", str(src), str(out), "--shard-mb", "0.05"])
        assert exit_.value.code == 1
        line = _one_line(capsys, 1)
        reason, fix = EXPECTED[fault]
        assert line.startswith("error: cannot write ") and reason in line and fix in line, line
        # Named: the output folder, or the file a failed write was writing into it.
        assert str(out) in line or str(out.parent) in line, line
        assert leftovers(out) == []


@pytest.mark.parametrize("fault", FAULTS)
def test_a_metrics_folder_that_cannot_be_made_is_an_error_naming_it(tmp_path, fault):
    """What the trainer turns into its one ``output_dir=...`` line (exit 1): an OSError whose
    file is the run folder or one inside it."""
    with faulty_output(tmp_path, fault) as out:
        run = out / "run" if fault == "full" else out
        if fault == "full":  # room for the folder and the open, not for the records
            writer = MetricsWriter(run)
            with pytest.raises(OutputError, match="No space left on device"):
                for step in range(1, 2000):
                    writer.write({"kind": "train", "step": step, "note": "x" * 200})
            return
        with pytest.raises(OSError) as failure:
            MetricsWriter(run)
        assert failure.value.filename is not None
        assert Path(failure.value.filename).is_relative_to(out), failure.value


def test_a_disk_filling_up_under_a_running_metrics_writer_is_one_line(tmp_path):
    before = set(threading.enumerate())
    with tmpfs(tmp_path / "disk") as disk:
        writer = MetricsWriter(disk / "run")
        writer.write({"kind": "train", "step": 1, "loss": 1.0})
        fill(disk, room=4 * 1024)
        with pytest.raises(OutputError) as failure:
            for step in range(2, 2000):
                writer.write({"kind": "train", "step": step, "loss": 1.0, "note": "x" * 200})
        message = str(failure.value)
        assert "\n" not in message and "No space left on device" in message
        assert message.startswith(f"cannot write {disk / 'run'}") and "free space" in message
        # The run's close (in its finally) on the still-full disk: one line again, and
        # TensorBoard's writer thread ends with it rather than outliving the disk.
        with pytest.raises(OutputError) as failure:
            writer.close()
        assert "\n" not in str(failure.value) and "free space" in str(failure.value)
        assert set(threading.enumerate()) - before == set()


@pytest.mark.parametrize("fault", FAULTS)
def test_checkpoint_save_in_a_faulty_folder_is_one_line_and_leaves_no_part(tmp_path, fault):
    state = {"step": 1, "model": {"w": torch.zeros(64 * 1024)}}  # 256 KiB: more than the room
    with faulty_output(tmp_path, fault) as out:
        with pytest.raises(CheckpointError) as failure:
            single_file.save(out / "checkpoints", 1, state, keep=2)
        message = str(failure.value)
        assert "\n" not in message and EXPECTED[fault][0] in message, message
        assert "there is no earlier one" in message
        assert leftovers(out) == []
        assert single_file.load_latest(out / "checkpoints") is None


@pytest.mark.parametrize("fault", FAULTS)
def test_results_in_a_faulty_folder_are_one_line_and_never_pass_for_complete(tmp_path, fault):
    weights = {"w": torch.zeros(64 * 1024)}  # 256 KiB: more than a full disk's room
    with faulty_output(tmp_path, fault) as out:
        with pytest.raises(OutputError) as failure:
            results.write(
                out / "results",
                weights,
                config={"model": "tiny"},
                summary={"step": 1},
                evaluation={"loss": 1.0},
                weights_metadata={},
            )
        message = str(failure.value)
        reason, fix = EXPECTED[fault]
        assert "\n" not in message and reason in message and fix in message, message
        assert str(out) in message, message
        assert not results.is_complete(out / "results")
        assert leftovers(out) == []


def test_a_tensorboard_folder_that_cannot_take_its_first_event_is_one_line(tmp_path):
    """TensorBoard writes and flushes its first event as its writer is made, in its writer
    thread, which hands the write's error (no file name) to the constructor."""
    with faulty_output(tmp_path, "full", room=0) as out:
        with pytest.raises(OutputError) as failure:
            MetricsWriter(out / "run")
        message = str(failure.value)
        assert message.startswith(f"cannot write {out / 'run' / 'tensorboard'}: "), message
        assert "No space left on device" in message and "free space" in message


def test_a_run_resumed_onto_a_full_disk_stops_in_one_line_and_keeps_its_checkpoint(tmp_path):
    """The run reads its checkpoint from the full disk, then TensorBoard's first event is the
    first write: one line naming the folder and the fix, exit 1 (an environment fault), and the
    checkpoint is still there to resume from once there is room."""
    repo = Path(__file__).resolve().parents[3]
    with tmpfs(tmp_path / "disk", size="16m") as disk:
        out = disk / "run"
        config = tiny_config(out, backend="local", run_steps=2)
        # The first run in process: only the resumed one needs to be the command.
        first = train(DEFAULTS.replace(**config), LocalDist())
        assert first.step == 2, first
        saved = single_file.list_checkpoints(out / "checkpoints")
        assert [step for step, _ in saved] == [2]
        fill(disk, room=0)
        resumed = subprocess.run(
            [sys.executable, "-m", "trainer", *to_flags(config)],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert resumed.returncode == 1, resumed.stdout[-2000:] + resumed.stderr[-3000:]
        assert "Traceback" not in resumed.stdout + resumed.stderr, resumed.stderr[-3000:]
        errors = [line for line in resumed.stderr.splitlines() if line.startswith("error: ")]
        assert errors == [resumed.stderr.strip().splitlines()[-1]], resumed.stderr[-3000:]
        assert errors[0].startswith(f"error: cannot write {out / 'tensorboard'}: No space left")
        assert "free space" in errors[0]
        assert single_file.list_checkpoints(out / "checkpoints") == saved
        found = single_file.load_latest(out / "checkpoints")
        assert found is not None and found[1]["step"] == 2


def test_a_tensorboard_disk_filling_up_mid_run_stops_the_run_with_its_last_checkpoint(tmp_path):
    """TensorBoard's folder on a disk of its own that fills up while the run trains: its writer
    thread meets the full disk, the run notices at its next record and stops there in one line,
    exit 1, its checkpoints (on another disk) complete."""
    out = tmp_path / "run"
    with tmpfs(out / "tensorboard", size="1m") as events:
        fill(events, room=4 * 1024)  # the first events fit, a few steps' more do not
        config = tiny_config(
            out, backend="local", synthetic_size=640, epochs=1, log_every=1, checkpoint_every=2
        )
        done = subprocess.run(
            [sys.executable, "-m", "trainer", *to_flags(config)],
            cwd=Path(__file__).resolve().parents[3],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert [line for line in done.stderr.splitlines() if line.startswith("error: ")] == [last]
    assert last.startswith(f"error: cannot write {out / 'tensorboard'}: No space left"), last
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # The step whose TensorBoard record failed (its metrics.jsonl line was written first).
    stopped = max(r["step"] for r in records if r["kind"] == "train")
    assert 2 <= stopped < 640 // 8, "the run stopped part-way"
    found = single_file.load_latest(out / "checkpoints")
    assert found is not None  # the newest, complete and verified: what a rerun resumes from
    assert found[1]["step"] % 2 == 0 and 0 <= stopped - found[1]["step"] <= 2, stopped


# Run as its own process: pytest replaces threading.excepthook while a test runs, so only a
# process of its own shows what a thread's uncaught error prints.
TENSORBOARD_ONLY = """
import sys
from pathlib import Path
from tests.trainer.fs_faults import fill
from trainer.common.files import OutputError
from trainer.outputs.metrics import MetricsWriter

disk = Path(sys.argv[1])
writer = MetricsWriter(disk / "run")
writer.scalars({"loss": 1.0}, 1)
fill(disk, room=4 * 1024)
try:
    try:
        for step in range(2, 100_000):  # events only: TensorBoard's thread meets the full disk
            writer.scalars({f"rank/{i}": 1.0 for i in range(10)}, step)
    finally:
        writer.close()
except OutputError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)
"""


def test_tensorboards_writer_thread_on_a_full_disk_prints_no_traceback_of_its_own(tmp_path):
    """TensorBoard's event writer thread re-raises a failed write (threading's hook prints its
    traceback) after keeping it for the next call, which raises it again here: one line."""
    with tmpfs(tmp_path / "disk") as disk:
        process = subprocess.run(
            [sys.executable, "-c", TENSORBOARD_ONLY, str(disk)],
            cwd=Path(__file__).resolve().parents[3],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert process.returncode == 1, process.stderr[-2000:]
    assert process.stderr.count("\n") == 1, process.stderr[-3000:]
    [line] = process.stderr.splitlines()
    assert line.startswith(f"error: cannot write {disk / 'run' / 'tensorboard'}"), line
    assert "No space left on device" in line and "free space" in line
