"""Which commit the ``acr`` builder builds from: the newest commit that changed the image
inputs, whether the checkout's image inputs have changes of their own, and whether a remote can
serve that commit (ACR Tasks clone it from there)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pulumi

from infra.image_inputs import IMAGE_INPUTS, REPO
from infra.settings.checks import ConfigError


@dataclass(frozen=True)
class SourceState:
    """What the acr builder would clone, and whether that is what the content tag describes."""

    commit: str  # the newest commit that changed the image inputs (same inputs as HEAD)
    dirty: bool  # the image inputs have uncommitted or untracked changes
    pushed: bool  # a remote-tracking branch contains ``commit``, so the remote can serve it


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def source_state(root: Path | None = None) -> SourceState:
    """Read the checkout at ``root`` (the repository by default). Raises ``OSError`` or
    ``CalledProcessError`` when git is missing or ``root`` is not a checkout."""
    root = root or REPO
    head = _git(root, "rev-parse", "HEAD")
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=all", "--", *IMAGE_INPUTS))
    # The commit that last changed the image inputs builds the same image as HEAD, and it
    # changes exactly when the content tag does: a commit that touches only infra/ does not
    # change the build task's definition, so a preview shows no task update for it.
    commit = _git(root, "log", "-1", "--format=%H", "HEAD", "--", *IMAGE_INPUTS) or head
    same = subprocess.run(
        ["git", "-C", str(root), "diff", "--quiet", commit, head, "--", *IMAGE_INPUTS],
        capture_output=True,
    )
    if same.returncode != 0:
        commit = head
    pushed = bool(_git(root, "branch", "--remotes", "--contains", commit))
    return SourceState(commit=commit, dirty=dirty, pushed=pushed)


def deploying() -> bool:
    """Whether this run builds: a real ``pulumi up``, not a preview and not Pulumi's mocks (the
    offline plan and the tests), where nothing is built and a warning is enough."""
    from pulumi.runtime.mocks import MockMonitor

    mocked = isinstance(pulumi.runtime.settings.get_monitor(), MockMonitor)
    return not pulumi.runtime.is_dry_run() and not mocked


def commit_to_build(root: Path | None = None, strict: bool | None = None) -> str:
    """The commit the acr builder builds (``<repo>#<commit>``), refused when it would not be the
    image its tag describes: uncommitted image inputs, or a commit the remote does not have.
    ``strict`` (default: ``deploying()``) raises ``ConfigError``; otherwise the same line is
    a warning. Called before any resource is declared."""
    strict = deploying() if strict is None else strict
    try:
        state = source_state(root)
    except (OSError, subprocess.CalledProcessError):
        raise ConfigError(
            "imageBuilder=acr: builds a git commit, but this folder is not a git checkout; "
            "run from a clone or use imageBuilder docker"
        ) from None
    short = state.commit[:12]
    problems = []
    if state.dirty:
        problems.append(
            f"imageBuilder=acr: the image inputs ({', '.join(IMAGE_INPUTS)}) have uncommitted "
            f"changes that the build of commit {short} would not contain, while the image tag "
            "hashes them; commit and push them, or use imageBuilder docker"
        )
    if not state.pushed:
        problems.append(
            f"imageBuilder=acr: commit {short} is not on the remote (no remote-tracking branch "
            "contains it), so ACR cannot clone it; push it first (git push), then run pulumi up"
        )
    for problem in problems:
        if strict:
            raise ConfigError(problem)
        pulumi.log.warn(f"{problem} (pulumi up will refuse this)")
    return state.commit
