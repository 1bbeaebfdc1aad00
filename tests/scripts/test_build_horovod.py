"""scripts/build_horovod.sh's choice of patches: every file of scripts/horovod-patches/ in the
order of their names, or the subset DT_HOROVOD_PATCHES names (bench/baseline_horovod.py)."""

from __future__ import annotations

import os
import subprocess

from tests.support.launchers import REPO

SCRIPT = REPO / "scripts" / "build_horovod.sh"


def test_a_patch_name_the_folder_does_not_hold_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        ["bash", str(SCRIPT), "python3", str(tmp_path / "wheels")],
        env={**os.environ, "DT_HOROVOD_PATCHES": "01-blocking-wait.patch 99-missing.patch"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "99-missing.patch" in result.stderr
    assert not (tmp_path / "wheels").exists()  # nothing built or cached


def test_the_patches_are_numbered_so_that_their_names_give_the_order():
    names = sorted(path.name for path in (REPO / "scripts" / "horovod-patches").iterdir())
    assert names == sorted(n for n in names if n.endswith(".patch") and n[:2].isdigit())
    assert [int(name[:2]) for name in names] == list(range(1, len(names) + 1))
