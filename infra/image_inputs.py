"""What the trainer image is built from, and the content tag that names it.

A light module (no Pulumi imports) because CI reads it to decide which stacks a change touches
(``python -m infra.tools.stacks changed``) with nothing but PyYAML installed.

The image holds only what it runs: the trainer sources (run from ``PYTHONPATH``, so neither
``pyproject.toml`` nor ``README.md`` is copied), the image's lock file and the Horovod build
script. Editing anything else (docs, the operator CLI in ``infra/tools/ops.py``, the Azure program)
keeps the tag, so `pulumi up` neither rebuilds the image nor replaces a running job.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = "docker/Dockerfile"
# .dockerignore admits exactly these (tests/docker checks it).
IMAGE_INPUTS = (
    DOCKERFILE,
    "docker/requirements.txt",
    "scripts/build_horovod.sh",
    "scripts/build_jpeg_region.sh",
    "scripts/horovod-blocking-wait.patch",
    "trainer",
)


def content_tag(root: Path = REPO) -> str:
    """A 16-hex-digit hash of the image inputs' paths and bytes (caches and bytecode excluded)."""
    digest = hashlib.sha256()
    for entry in IMAGE_INPUTS:
        path = root / entry
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            relative = file.relative_to(root).as_posix()
            if "__pycache__" in relative or relative.endswith(".pyc"):
                continue
            digest.update(relative.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
