"""Which stacks exist, and which a change touches (for PR previews and deploys).

python -m dt_commands.stacks changed BASE [HEAD]   # JSON list of stacks to preview or deploy
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

from infra.image_inputs import IMAGE_INPUTS, REPO
from infra.naming import PROJECT
from trainer.common.cli import OneLineParser, fail

# Files that change every stack's program (anything under these prefixes).
PROGRAM_PATHS = ("__main__.py", "Pulumi.yaml", "infra/", "policy/", "pyproject.toml")


def all_stacks(repo: Path = REPO) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in repo.glob("Pulumi.*.yaml"))


def job_stacks(stacks: Iterable[str], repo: Path = REPO) -> list[str]:
    """The stacks that submit jobs (a `jobs` map, or the submitJob shorthand): a new image tag
    replaces their jobs."""
    project = yaml.safe_load((repo / "Pulumi.yaml").read_text(encoding="utf-8"))
    default = project["config"][f"{PROJECT}:submitJob"].get("default", True)
    submitting = []
    for stack in stacks:
        path = repo / f"Pulumi.{stack}.yaml"
        config = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("config") or {}
        shorthand = config.get(f"{PROJECT}:submitJob", default) not in (False, "false")
        if config.get(f"{PROJECT}:jobs") or shorthand:
            submitting.append(stack)
    return submitting


def changed_stacks(
    changed_files: Iterable[str], stacks: Iterable[str], submitting: Iterable[str] = ()
) -> list[str]:
    """Every stack when the program changed; the stacks that submit jobs when the image inputs
    changed (a new tag, a new image, a replaced job); and those whose stack file changed."""
    files, existing = list(changed_files), sorted(stacks)
    if any(f.startswith(PROGRAM_PATHS) for f in files):
        return existing
    touched = {
        f[len("Pulumi.") : -len(".yaml")]
        for f in files
        if f.startswith("Pulumi.") and f.endswith(".yaml")
    }
    if any(f == entry or f.startswith(f"{entry}/") for f in files for entry in IMAGE_INPUTS):
        touched |= set(submitting)
    return [s for s in existing if s in touched]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m dt_commands.stacks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    changed = commands.add_parser("changed", help="JSON list of the stacks a change touches")
    changed.add_argument("base", help="the commit the change is compared with (merge base)")
    changed.add_argument("head", nargs="?", default="HEAD", help="the changed commit")
    changed.error = parser.error  # type: ignore[method-assign]
    args = parser.parse_args(argv)
    diff = subprocess.run(
        ["git", "diff", "--name-only", f"{args.base}...{args.head}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if diff.returncode != 0:
        reason = (diff.stderr.strip().splitlines() or ["no output"])[0]
        fail(f"git diff {args.base}...{args.head} failed: {reason}", 2)
    stacks = all_stacks()
    print(json.dumps(changed_stacks(diff.stdout.split(), stacks, job_stacks(stacks))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
