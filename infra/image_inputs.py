"""What the trainer image is built from, and the content tag that names it.
Why it is built this way: docs/internals.md, `infra/image_inputs.py`."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = "docker/Dockerfile"
# .dockerignore admits exactly these (tests/docker checks it).
IMAGE_INPUTS = (
    DOCKERFILE,
    "docker/requirements.txt",
    "scripts/build_gpu_wheel.sh",
    "scripts/build_horovod.sh",
    "scripts/build_jpeg_region.sh",
    "scripts/horovod-patches",
    "trainer",
)


# An ssh remote (git@host:org/repo.git or ssh://git@host/org/repo) and its https clone URL.
_GIT_SSH = re.compile(r"^(?:ssh://)?git@([^:/]+)[:/](.+?)(?:\.git)?/?$")


def git_https_url(remote: str) -> str | None:
    """An https://...git clone URL for a remote URL (https, or ssh as git@host:org/repo)."""
    remote = remote.strip()
    if remote.startswith("https://"):
        return remote if remote.endswith(".git") else f"{remote.rstrip('/')}.git"
    match = _GIT_SSH.match(remote)
    return f"https://{match.group(1)}/{match.group(2)}.git" if match else None


def origin_clone_url(root: Path = REPO) -> str | None:
    """The https clone URL of the checkout's ``origin`` remote; None without one (not a
    checkout, no origin, or an origin that is a local path)."""
    try:
        remote = subprocess.run(
            ["git", "-C", str(root), "remote", "get-url", "origin"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return git_https_url(remote.stdout) if remote.returncode == 0 else None


class ImageInputsError(RuntimeError):
    """A checkout whose tracked files git could not list; the message is one line."""


def content_tag(root: Path = REPO) -> str:
    """A 16-hex-digit hash of the image inputs' paths and bytes (working-tree bytes of the
    tracked files in a checkout; every file but bytecode outside one)."""
    digest = hashlib.sha256()
    for file in input_files(root):
        digest.update(file.encode() + b"\0" + (root / file).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def input_files(root: Path = REPO) -> list[str]:
    """The image inputs' files as root-relative POSIX paths, in hashing order (``IMAGE_INPUTS``
    order, then path components: the order the tag has always used, so tags do not move)."""
    tracked = _tracked_files(root)
    files: list[str] = []
    for entry in IMAGE_INPUTS:
        if tracked is not None:
            found = [f for f in tracked if f == entry or f.startswith(entry + "/")]
        else:
            path = root / entry
            found = [
                p.relative_to(root).as_posix()
                for p in (path.rglob("*") if path.is_dir() else [path])
                if p.is_file()
            ]
            found = [f for f in found if "__pycache__" not in f and not f.endswith(".pyc")]
        # A tracked file deleted in the working tree is not in what would be built.
        files += sorted((f for f in found if (root / f).is_file()), key=_components)
    return files


def _components(relative: str) -> tuple[str, ...]:
    return PurePosixPath(relative).parts


def _tracked_files(root: Path) -> list[str] | None:
    """The tracked files under the image inputs, or None when ``root`` is not a checkout's top
    (no ``.git`` there: a source archive)."""
    if not (root / ".git").exists():
        return None
    try:
        top = _git(root, "rev-parse", "--show-toplevel").decode().strip()
        if Path(top).resolve() != root.resolve():
            raise ValueError(f"git sees {top} as the checkout")
        listed = _git(root, "ls-files", "-z", "--cached", "--", *IMAGE_INPUTS)
    except (OSError, ValueError, subprocess.CalledProcessError) as err:
        detail = (getattr(err, "stderr", b"") or b"").decode(errors="replace").strip()
        reason = detail.splitlines()[0] if detail else str(err)
        raise ImageInputsError(
            f"content tag: cannot list the tracked image inputs in {root} ({reason}); "
            "the tag hashes tracked files only, so git must read this checkout"
        ) from None
    return [name for name in listed.decode().split("\0") if name]


def _git(root: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True).stdout
