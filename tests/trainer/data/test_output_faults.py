"""``prepare`` and ``stage`` writing into real failing file systems (tests/trainer/fs_faults.py):
one line naming the path and the fix, exit 1, and nothing left that passes for a complete
dataset."""

from __future__ import annotations

import pytest

from tests.trainer.fs_faults import FAULTS, faulty_output, leftovers
from trainer.common.files import OutputError
from trainer.data.__main__ import main
from trainer.data.manifest import MANIFEST_NAME
from trainer.data.transfer import stage, upload

REASONS = {
    "full": "No space left on device",
    "read-only": "Read-only file system",
    "immutable": "Operation not permitted",
    "file-in-the-way": "Not a directory",
}


@pytest.mark.parametrize("fault", FAULTS)
def test_prepare_into_a_faulty_folder_is_one_line_exit_1_and_no_dataset(
    tmp_path, capsys, dataset, fault
):
    # The images (about 250 KiB as shards) overrun the 64 KiB a full disk leaves.
    with faulty_output(tmp_path, fault) as out:
        with pytest.raises(SystemExit) as exit_:
            main(["prepare", str(dataset), str(out), "--shard-mb", "0.03", "--processes", "1"])
        captured = capsys.readouterr()
        assert exit_.value.code == 1, captured.err
        (line,) = captured.err.strip().splitlines()
        assert line.startswith(f"error: cannot write {out}") and REASONS[fault] in line, line
        assert "Traceback" not in captured.err
        # A full disk keeps the shards that were complete, never a manifest or a part of one.
        left = leftovers(out)
        assert MANIFEST_NAME not in left and not [n for n in left if ".partial-" in n], left
        assert fault == "full" or left == []


@pytest.mark.parametrize("fault", FAULTS)
def test_stage_into_a_faulty_folder_names_it_and_leaves_no_partial_shard(
    tmp_path, shards, container, fault
):
    upload(shards, container, "ds", log=lambda _: None)
    with faulty_output(tmp_path, fault) as dest:
        with pytest.raises(OutputError) as failure:
            stage(container, "ds", dest, parallel=2, log=lambda _: None)
        message = str(failure.value)
        assert "\n" not in message and REASONS[fault] in message, message
        assert message.startswith(f"cannot write {dest}")
        left = leftovers(dest)
        assert MANIFEST_NAME not in left and not [n for n in left if ".partial-" in n], left
