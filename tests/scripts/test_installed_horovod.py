"""The Horovod the set-up installed is the build scripts/build_horovod.sh makes: PyTorch and
Gloo support, and our patches (scripts/horovod-patches/) by their markers (what each changes,
the Gloo in-place one included: tests/scripts/test_horovod_build.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.bounds import STUCK_SECONDS
from tests.support.launchers import BIN


def test_the_installed_horovod_has_pytorch_gloo_the_blocking_wait_and_the_wake():
    build = subprocess.run(
        [str(BIN / "horovodrun"), "--check-build"],
        capture_output=True,
        text=True,
        timeout=STUCK_SECONDS,
    )
    assert "[X] PyTorch" in build.stdout and "[X] Gloo" in build.stdout
    marker = subprocess.run(
        [sys.executable, "-c", "from horovod.torch import mpi_lib_v2 as m; "
         "print(m.horovod_torch_wait_blocks(), m.horovod_torch_wait_wakes())"],
        capture_output=True, text=True, timeout=STUCK_SECONDS,
    )  # fmt: skip
    assert marker.stdout.strip() == "1 1", marker.stderr
