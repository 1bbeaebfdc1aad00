"""A results folder's manifest (``trainer.outputs.results``): ``manifest.json``, written last, lists
every other file with its size and SHA-256; a folder is complete only when its manifest is there and
every file matches it. Pure (no torch): the operator CLI's ``fetch`` (dt_commands/jobs/fetch.py)
reads manifests with it too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from trainer.common.errors import first_line, one_line
from trainer.common.files import sha256_file

MANIFEST = "manifest.json"
SCHEMA = 1
# A file name in a manifest: one plain name, never a path, so a reader cannot be led out of the
# folder it downloads into.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ResultsError(RuntimeError):
    """Results cannot be read, verified or uploaded; the message is one line naming where."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


@dataclass(frozen=True)
class Entry:
    """One file of a results folder, as its manifest lists it."""

    name: str
    size: int
    sha256: str


def manifest_bytes(entries: list[Entry]) -> bytes:
    files = [{"name": e.name, "bytes": e.size, "sha256": e.sha256} for e in entries]
    document = {"schema": SCHEMA, "files": files}
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


def parse_manifest(data: bytes, where: str) -> list[Entry]:
    """A manifest's entries; ResultsError (one line naming ``where``) for anything else."""
    try:
        document = json.loads(data)
        if not isinstance(document, dict) or document.get("schema") != SCHEMA:
            raise ValueError(f"not a schema {SCHEMA} results manifest")
        files = document["files"]
        if not isinstance(files, list) or not files:
            raise ValueError("lists no files")
        entries = []
        for item in files:
            name, size, digest = item["name"], item["bytes"], item["sha256"]
            if not isinstance(name, str) or not _NAME.match(name) or name == MANIFEST:
                raise ValueError(f"file name {name!r} is not a plain file name")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError(f"{name}: bytes={size!r} is not a size")
            if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ValueError(f"{name}: sha256={digest!r} is not a SHA-256")
            entries.append(Entry(name, size, digest))
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        reason = f"missing {err}" if isinstance(err, KeyError) else first_line(err)
        raise ResultsError(f"{where}: not a valid results manifest ({reason})") from None
    if len({e.name for e in entries}) != len(entries):
        raise ResultsError(f"{where}: not a valid results manifest (a file is listed twice)")
    return entries


def verify(folder: Path) -> list[Entry]:
    """The entries of a complete results folder; ResultsError when it is not one."""
    try:
        data = (folder / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise ResultsError(f"{folder}: no {MANIFEST}: the results are incomplete") from None
    entries = parse_manifest(data, str(folder / MANIFEST))
    for entry in entries:
        path = folder / entry.name
        try:
            digest = sha256_file(path)
        except FileNotFoundError:
            raise ResultsError(f"{path}: missing, but listed in {MANIFEST}") from None
        if digest != entry.sha256:
            raise ResultsError(f"{path}: SHA-256 {digest} differs from {MANIFEST}'s")
    return entries
