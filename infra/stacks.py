"""Which stacks exist, and which a change touches (for PR previews and deploys).

python -m infra.stacks changed BASE [HEAD]   # JSON list of stacks to preview or deploy
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Files that change every stack's program (anything under these prefixes).
PROGRAM_PATHS = ("__main__.py", "Pulumi.yaml", "infra/", "policy/", "pyproject.toml")


def all_stacks(repo: Path = REPO) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in repo.glob("Pulumi.*.yaml"))


def changed_stacks(changed_files: Iterable[str], stacks: Iterable[str]) -> list[str]:
    """Every stack when the program changed; otherwise those whose stack file changed."""
    files, existing = list(changed_files), sorted(stacks)
    if any(f.startswith(PROGRAM_PATHS) for f in files):
        return existing
    touched = {
        f[len("Pulumi.") : -len(".yaml")]
        for f in files
        if f.startswith("Pulumi.") and f.endswith(".yaml")
    }
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
    print(json.dumps(changed_stacks(diff.stdout.split(), all_stacks())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
