"""The Horovod our later patches are measured against: the same release built with the first
patch only (scripts/horovod-patches/01-blocking-wait.patch, the engine as shipped before the wake
and Gloo in-place patches), installed into a folder that goes first on a row's PYTHONPATH.
Built by scripts/build_horovod.sh and cached as the set-up's own wheel is (minutes, once)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.common import REPO

BASELINE_PATCHES = "01-blocking-wait.patch"


def cache_dir() -> Path:
    """Where the slow builds are cached: the Makefile's CACHE_DIR, which ``make bench`` passes as
    DT_CACHE_DIR; run directly, the same rule's default."""
    if os.environ.get("DT_CACHE_DIR"):
        return Path(os.environ["DT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "distributed-training"


def install() -> Path:
    """A folder holding the baseline Horovod package, built and installed if not yet cached."""
    built = subprocess.run(
        ["bash", "scripts/build_horovod.sh", sys.executable, str(cache_dir() / "wheels")],
        cwd=REPO,
        env={**os.environ, "DT_HOROVOD_PATCHES": BASELINE_PATCHES},
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    wheel = Path(built.stdout.strip())
    target = wheel.parent / "site"
    if not (target / ".complete").exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
             str(target), str(wheel)],
            check=True,
        )  # fmt: skip
        (target / ".complete").touch()
    return target


def wakes(env: dict[str, str]) -> bool:
    """Whether the Horovod a process with ``env`` imports carries the wake-on-wait patch."""
    probe = subprocess.run(
        [sys.executable, "-c", "from horovod.torch import mpi_lib_v2 as m; "
         "print(hasattr(m, 'horovod_torch_wait_wakes'))"],
        env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return probe.stdout.strip() == "True"


def row_env() -> dict[str, str]:
    """The environment of a row that runs the baseline, checked to load it (and the installed
    engine checked to be the patched one), so the comparison cannot silently run one engine
    twice."""
    path = [str(install()), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(part for part in path if part)}
    if wakes(env) or not wakes({}):
        raise RuntimeError(
            "the baseline row would not run the baseline Horovod, or the installed Horovod "
            "lacks the wake patch: rerun `make setup`"
        )
    return env
