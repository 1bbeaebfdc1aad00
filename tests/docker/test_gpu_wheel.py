"""The image's Horovod wheel (NCCL GPU operations), built by ``make test`` on this machine with
scripts/build_gpu_wheel.sh, as the image's builder stage builds it: it must carry PyTorch, NCCL
and Gloo support and the blocking-wait patch, loaded by the CUDA build of torch it runs with."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAMP = REPO / ".venv" / ".gpu-wheel"  # written by the Makefile: the wheel, then its python


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, Path]:
    assert STAMP.is_file(), "make test builds the GPU wheel first (scripts/build_gpu_wheel.sh)"
    wheel, python = (Path(line) for line in STAMP.read_text().split())
    target = tmp_path_factory.mktemp("horovod-gpu")
    # Beside the build environment's CUDA torch, never into it: the cached environment stays
    # as the build left it.
    subprocess.run(
        [str(python), "-m", "pip", "install", "--isolated", "--quiet", "--no-deps",
         "--target", str(target), str(wheel)],
        check=True, timeout=300,
    )  # fmt: skip
    return wheel, python, target


def _run(python: Path, target: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(target), "PATH": f"{python.parent}:/usr/bin:/bin"},
    )


def test_the_wheel_is_the_gpu_variant_with_the_torch_extension(built):
    wheel, _, _ = built
    assert "-gpu-" in wheel.parent.name  # build_horovod.sh's cache key names the variant
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("horovod/torch/mpi_lib_v2") and n.endswith(".so") for n in names)


def test_horovod_reports_pytorch_nccl_and_gloo_with_the_cuda_torch(built):
    _, python, target = built
    check = _run(
        python,
        target,
        "import sys; from horovod.runner.launch import run_commandline; "
        "sys.argv = ['horovodrun', '--check-build']; run_commandline()",
    )
    assert check.returncode == 0, check.stderr[-2000:]
    for feature in ("[X] PyTorch", "[X] NCCL", "[X] Gloo"):
        assert feature in check.stdout, check.stdout
    cuda = _run(python, target, "import torch; print(torch.version.cuda)")
    assert cuda.stdout.strip().startswith("13."), cuda.stderr[-2000:]


def test_the_blocking_wait_and_wake_patches_are_in_the_gpu_build(built):
    _, python, target = built
    patched = _run(
        python,
        target,
        "import torch; from horovod.torch import mpi_lib_v2 as m; "
        "print(m.horovod_torch_wait_blocks(), m.horovod_torch_wait_wakes())",
    )
    assert patched.stdout.strip() == "1 1", patched.stderr[-2000:]
