"""Which stacks exist, and which a change touches (for PR previews and deploys).

python -m infra.stacks changed BASE [HEAD]   # JSON list of stacks to preview or deploy
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

from infra.image_inputs import IMAGE_INPUTS

REPO = Path(__file__).resolve().parent.parent
PROJECT = "gpu-cluster"
# Files that change every stack's program (anything under these prefixes).
PROGRAM_PATHS = ("__main__.py", "Pulumi.yaml", "infra/", "policy/", "pyproject.toml")


def all_stacks(repo: Path = REPO) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in repo.glob("Pulumi.*.yaml"))


def job_stacks(stacks: Iterable[str], repo: Path = REPO) -> list[str]:
    """The stacks that submit a job: a new image tag replaces their job."""
    project = yaml.safe_load((repo / "Pulumi.yaml").read_text(encoding="utf-8"))
    default = project["config"][f"{PROJECT}:submitJob"].get("default", True)
    submitting = []
    for stack in stacks:
        path = repo / f"Pulumi.{stack}.yaml"
        config = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("config") or {}
        if config.get(f"{PROJECT}:submitJob", default) not in (False, "false"):
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


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[0] != "changed":
        print("usage: python -m infra.stacks changed BASE [HEAD]", file=sys.stderr)
        return 2
    base, head = argv[1], argv[2] if len(argv) == 3 else "HEAD"
    diff = subprocess.run(
        ["git", "diff", "--name-only", f"{base}...{head}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if diff.returncode != 0:
        print(f"error: git diff {base}...{head} failed: {diff.stderr.strip()}", file=sys.stderr)
        return 2
    stacks = all_stacks()
    print(json.dumps(changed_stacks(diff.stdout.split(), stacks, job_stacks(stacks))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
