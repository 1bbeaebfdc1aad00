"""The Horovod the set-up installed is the build scripts/build_horovod.sh makes: PyTorch and
Gloo support, and our patches (scripts/horovod-patches/) by their markers (what each changes,
the Gloo in-place one included: tests/scripts/test_horovod_build.py)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

import pytest

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


def test_a_host_whose_name_does_not_resolve_gets_an_error_naming_it_not_a_crash():
    """Gloo's lookup of the host's own name (patch 06): hvd.init() on a host whose name resolves
    nowhere (a new UTS namespace with a made-up name; buildah's containers are such hosts)
    died of SIGSEGV in the image before the patch."""
    if os.geteuid() != 0:
        pytest.skip("a host name of its own needs a UTS namespace: needs root")
    init = f"{shlex.quote(sys.executable)} -c 'import horovod.torch as hvd; hvd.init()'"
    done = subprocess.run(
        ["unshare", "--uts", "bash", "-c", f"hostname unresolvable-host.invalid && {init}"],
        capture_output=True, text=True, timeout=STUCK_SECONDS,
    )  # fmt: skip
    assert done.returncode not in (0, -signal.SIGSEGV, 128 + signal.SIGSEGV), done
    assert "getaddrinfo for hostname unresolvable-host.invalid" in done.stderr, done.stderr
