"""Every shard checked against the manifest's SHA-256 once per node, before training reads it:
the node's ranks split the hashing and the first records the verified shards beside them
(``VERIFIED_NAME``). Why before the first batch, and what the record keys on: docs/data.md,
"How it works".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from trainer.common.files import sha256_file, write_atomic
from trainer.data.manifest import MANIFEST_NAME, VERIFIED_NAME, ShardEntry
from trainer.data.node_memory import NodeGroup, split

log = logging.getLogger(__name__)


def _identity(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns]


def _key(shard: ShardEntry) -> str:
    return f"{shard.sha256} {shard.name}"


def read_record(folder: Path) -> dict[str, list[int]]:
    """The shards recorded as verified in ``folder`` (none when there is no readable record)."""
    try:
        body = json.loads((folder / VERIFIED_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _unverified(folder: Path, shards: Sequence[ShardEntry]) -> list[ShardEntry]:
    record = read_record(folder)
    pending = []
    for shard in shards:
        try:
            known = record.get(_key(shard)) == _identity(folder / shard.name)
        except OSError:
            known = False  # hashing it names the problem
        if not known:
            pending.append(shard)
    return pending


def _check(folder: Path, shards: Sequence[ShardEntry]) -> tuple[str | None, dict[str, list[int]]]:
    """(why the first bad shard is bad or None, the verified shards' record entries)."""
    verified: dict[str, list[int]] = {}
    for shard in shards:
        path = folder / shard.name
        try:
            digest = sha256_file(path)
        except OSError as err:
            return f"shard {path}: cannot read it ({err.strerror}); stage it again", verified
        if digest != shard.sha256:
            return (
                f"shard {path} does not match its SHA-256 in {folder / MANIFEST_NAME} (it "
                f"changed after it was written: a flipped bit, a damaged copy): stage it again "
                f"(`dt-data stage`) or prepare the dataset again"
            ), verified
        verified[_key(shard)] = _identity(path)
    return None, verified


def verify_shards(folder: Path, shards: Sequence[ShardEntry], group: NodeGroup) -> int:
    """Check the shards in ``folder`` this node has not verified; a collective over every rank
    (``group``'s exchanges). Raises a ``DataError`` naming the first bad shard on every rank.
    Returns how many shards this rank hashed."""
    pending = _unverified(folder, shards)
    part = split(len(pending), group.size)[group.position]
    mine = pending[part.start : part.stop]
    if mine:
        log.info("verifying %d of %d shard(s) against %s", len(mine), len(shards), MANIFEST_NAME)
    error, verified = _check(folder, mine)
    group.first_error(error)
    every = group.gather(verified)
    if group.is_leader and pending:
        record = read_record(folder)
        for entries in every:
            record.update(entries)
        try:
            write_atomic(folder / VERIFIED_NAME, json.dumps(record, sort_keys=True).encode())
        except OSError as err:
            log.info(
                "cannot record the verified shards in %s (%s): they are verified again at the "
                "next start",
                folder,
                err.strerror,
            )
    return len(mine)
