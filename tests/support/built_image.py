"""The trainer image `make image` built for this checkout (scripts/build_image.sh: buildah, as ACR
Tasks builds it), run here as a node runs it: a working container of it, commands run inside
with ``buildah run --isolation chroot`` as the image's user, with the image's environment and
the folders a test binds. ``make test`` builds it first (its layers cached), so the tag this
checkout's inputs name is there; a test run without it fails with the command that builds it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.image_inputs import content_tag

REPOSITORY = "localhost/distributed-training/trainer"  # scripts/build_image.sh tags it so


def image_name() -> str:
    """The reference `make image` gives this checkout's image: its inputs' content tag."""
    return f"{REPOSITORY}:{content_tag()}"


def _buildah(*args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        ["buildah", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def image_config(name: str) -> dict[str, Any]:
    """The image's configuration as Docker reads it (``docker image inspect``'s Config)."""
    inspected = json.loads(_buildah("inspect", "--type", "image", name))
    return inspected["Docker"]["config"]


@dataclass(frozen=True)
class ImageContainer:
    """A working container of the image: its root file system, mounted here, and commands run
    in it."""

    name: str
    root: Path

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        binds: Sequence[tuple[Path, str]] = (),
        user: str = "1000:1000",
        cwd: str | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` inside the image, as ``user``, with the image's environment and ``env``
        over it, each ``(host folder, path inside)`` of ``binds`` mounted read-write."""
        options = ["--isolation", "chroot", "--user", user]
        for key, value in (env or {}).items():
            options += ["--env", f"{key}={value}"]
        for host, inside in binds:
            options += ["--volume", f"{host}:{inside}"]
        if cwd is not None:
            options += ["--workingdir", cwd]
        return subprocess.run(
            ["buildah", "run", *options, self.name, "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@contextmanager
def image_container(name: str) -> Iterator[ImageContainer]:
    """A working container of image ``name``, removed afterwards."""
    if subprocess.run(
        ["buildah", "inspect", "--type", "image", name], capture_output=True, check=False
    ).returncode:
        raise RuntimeError(
            f"no image {name}: `make image` builds the image of this checkout (make test does "
            "it first)"
        )
    container = _buildah("from", "--pull-never", "--quiet", name).strip()
    try:
        yield ImageContainer(container, Path(_buildah("mount", container).strip()))
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
