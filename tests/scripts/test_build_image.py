"""`make image` (scripts/build_image.sh) run in bash as make runs it, against stub buildah,
mmdebstrap and apt-get that record their command lines: the base it makes and caches, the build
it asks buildah for, and its one-line refusals. (The real build: `make image`, minutes and
gigabytes; docs/benchmarks.md has its figures.)"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = (
    "bash",
    "sed",
    "cat",
    "sha256sum",
    "cut",
    "find",
    "rm",
    "mv",
    "mkdir",
    "touch",
    "dirname",
    "basename",
)
RECORDING = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> "$CALLS"
"""
STUBS = {
    "buildah": RECORDING
    + """case "$1" in
  from) echo ctr ;;
  inspect) case "$*" in *trainer:*) [ -e "$STATE/built" ] ;; *) [ -e "$STATE/committed" ] ;; esac ;;
  commit) touch "$STATE/committed" ;;
  bud) touch "$STATE/built" ;;
esac
""",
    # mmdebstrap SUITE TARGET MIRROR: writes the root file system to TARGET.
    "mmdebstrap": RECORDING + 'touch "${@: -2:1}"\n',
    "apt-get": RECORDING,
    "id": '#!/bin/bash\necho "$UID_SEEN"\n',
}


def _root(tmp_path: Path, base_image: str | None = None) -> Path:
    """A checkout holding the script, the Dockerfile and a python that prints a content tag."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "build_image.sh", root / "scripts")
    (root / "docker").mkdir()
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    if base_image is not None:
        dockerfile = dockerfile.replace(
            "ARG BASE_IMAGE=debian:13-slim", f"ARG BASE_IMAGE={base_image}"
        )
    (root / "docker" / "Dockerfile").write_text(dockerfile)
    (root / ".venv" / "bin").mkdir(parents=True)
    python = root / ".venv" / "bin" / "python"
    python.write_text("#!/bin/bash\necho 0123456789abcdef\n")
    python.chmod(0o755)
    return root


def _run(
    tmp_path: Path, root: Path, uid: int = 0, stubs=STUBS
) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        for tool in TOOLS:
            os.symlink(shutil.which(tool), bin_dir / tool)
        for name, body in stubs.items():
            (bin_dir / name).write_text(body)
            (bin_dir / name).chmod(0o755)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    env = {"PATH": str(bin_dir), "CALLS": str(calls), "STATE": str(state), "UID_SEEN": str(uid)}
    done = subprocess.run(
        ["bash", "scripts/build_image.sh", str(tmp_path / "cache")],
        cwd=root, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done, calls.read_text().splitlines()


def test_the_first_build_makes_the_release_base_and_builds_the_dockerfile_as_acr_does(tmp_path):
    root = _root(tmp_path)
    done, calls = _run(tmp_path, root)
    assert done.returncode == 0, done.stderr
    image = "localhost/distributed-training/trainer:0123456789abcdef"
    assert done.stdout == image + "\n"
    [made] = [shlex.split(c) for c in calls if c.startswith("mmdebstrap ")]
    assert made[1:3] == ["--variant=minbase", "--include=ca-certificates"]
    # The release the Dockerfile's default base names (13: trixie), from Debian's archive.
    assert made[-3] == "trixie" and made[-1] == "http://deb.debian.org/debian"
    rootfs = Path(made[-2].removesuffix(".tmp"))
    assert rootfs.parent == tmp_path / "cache" / "image" and rootfs.exists()
    [bud] = [shlex.split(c) for c in calls if c.startswith("buildah bud ")]
    base = next(word.split("=", 1)[1] for word in bud if word.startswith("BASE_IMAGE="))
    assert base.startswith("localhost/distributed-training/debian:trixie-")
    # Docker's image format (the Dockerfile's SHELL exists only there), root's chroot isolation,
    # the layers kept; the only build argument is the one ACR gets.
    assert bud[2:] == ["--format", "docker", "--isolation", "chroot", "--layers",
                       "-f", "docker/Dockerfile", "--build-arg", f"BASE_IMAGE={base}",
                       "-t", image, "."]  # fmt: skip
    assert f"buildah add ctr {rootfs} /" in calls and f"buildah commit --quiet ctr {base}" in calls
    assert not [c for c in calls if c.startswith("apt-get")]  # the tools are there


def test_an_image_built_for_these_inputs_is_not_built_again(tmp_path):
    root = _root(tmp_path)
    _run(tmp_path, root)
    done, calls = _run(tmp_path, root)
    image = "localhost/distributed-training/trainer:0123456789abcdef"
    assert done.returncode == 0 and done.stdout == image + "\n", done.stderr
    assert calls == [f"buildah inspect --type image {image}"]


def test_a_second_build_reuses_the_base_it_made(tmp_path):
    root = _root(tmp_path)
    _run(tmp_path, root)
    (tmp_path / "state" / "built").unlink()  # the inputs changed: another tag
    done, calls = _run(tmp_path, root)
    assert done.returncode == 0, done.stderr
    assert not [c for c in calls if c.startswith(("mmdebstrap", "buildah add", "buildah commit"))]
    assert [c for c in calls if c.startswith("buildah bud ")]


@pytest.mark.parametrize("base_image", ["ubuntu:22.04", "nvidia/cuda:13.0.1-devel-ubuntu22.04"])
def test_a_base_that_is_not_a_debian_slim_image_is_one_line_before_anything_runs(
    tmp_path, base_image
):
    done, calls = _run(tmp_path, _root(tmp_path, base_image))
    assert done.returncode == 1
    assert done.stderr == (
        f"make image: docker/Dockerfile: ARG BASE_IMAGE={base_image} is not a "
        "debian:<release>-slim image; this script makes only those\n"
    )
    assert calls == []


def test_missing_tools_without_root_are_one_line(tmp_path):
    stubs = {name: body for name, body in STUBS.items() if name == "id"}
    done, calls = _run(tmp_path, _root(tmp_path), uid=1000, stubs=stubs)
    assert done.returncode == 1
    assert done.stderr == (
        "make image: buildah and mmdebstrap are missing; run as root to install them with apt\n"
    )
    assert calls == []


def test_a_failed_base_leaves_no_half_made_root_file_system(tmp_path):
    # mmdebstrap dies after writing part of its output (the archive unreachable mid-way).
    stubs = {**STUBS, "mmdebstrap": RECORDING + 'echo partial > "${@: -2:1}"; exit 1\n'}
    done, calls = _run(tmp_path, _root(tmp_path), stubs=stubs)
    assert done.returncode == 1, done
    assert list((tmp_path / "cache" / "image").iterdir()) == []
    # Only the look for an image of these inputs, before the base was made.
    assert [c for c in calls if c.startswith("buildah")] == [
        "buildah inspect --type image localhost/distributed-training/trainer:0123456789abcdef"
    ]
