"""Staging killed mid-transfer: the rerun completes, no partial shard is ever visible, and
every checksum matches (Azurite on 127.0.0.1)."""

import subprocess
import sys

import pytest

from tests.conftest import checksums
from trainer.data.manifest import MANIFEST_NAME
from trainer.data.transfer import stage, upload

QUIET = {"log": lambda _: None}
HERE = __file__.rsplit("/", 1)[0]

# The killed staging process and the rerun: none may outlive the test.
pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def test_interrupted_stage_completes_on_rerun_without_partial_shards(
    tmp_path, shards, azurite, container
):
    upload(shards, container, "ds", **QUIET)
    dest = tmp_path / "local-nvme"
    killed = subprocess.run(
        [
            sys.executable,
            f"{HERE}/stage_until_killed.py",
            azurite,
            container.container_name,
            "ds",
            str(dest),
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    visible = sorted(p.name for p in dest.iterdir() if not p.name.startswith("."))
    assert len(visible) == 2 and MANIFEST_NAME not in visible  # two renamed, third was partial
    assert any(".partial-" in p.name for p in dest.iterdir())

    result = stage(container, "ds", dest, **QUIET)
    assert result.skipped == 2
    assert checksums(dest) == checksums(shards)  # no leftovers, all checksums match
