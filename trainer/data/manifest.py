"""The shard manifest: which shards a prepared dataset has, their sizes, sample counts and
SHA-256, and the class index. Every reader verifies data against it; nothing trains on a shard
the manifest does not vouch for."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainer.common.files import sha256_file
from trainer.data.errors import DataError

MANIFEST_NAME = "manifest.json"
# The largest shard prepare and prepare-text write (64 GiB): beyond it a size is a typo.
MAX_SHARD_MB = 65536.0
# Beside the shards: which of them this node already checked against their SHA-256
# (``trainer.data.verify``); a later prepare removes it with the shards it names.
VERIFIED_NAME = ".verified-shards.json"
FORMAT = "distributed-training-shards/1"


@dataclass(frozen=True)
class ShardEntry:
    name: str
    bytes: int
    samples: int
    sha256: str


@dataclass(frozen=True)
class SplitEntry:
    samples: int
    shards: tuple[ShardEntry, ...]
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Manifest:
    classes: tuple[str, ...]
    splits: dict[str, SplitEntry] = field(default_factory=dict)
    # prepare's --max-short-side: images with a longer short side were stored scaled down to
    # it; 0: every image is stored as it was.
    max_short_side: int = 0

    @property
    def shards(self) -> tuple[ShardEntry, ...]:
        return tuple(shard for split in self.splits.values() for shard in split.shards)

    def to_json(self) -> str:
        """Canonical text (sorted keys, no timestamps): the same dataset gives the same bytes."""
        body = {
            "format": FORMAT,
            "classes": list(self.classes),
            "max_short_side": self.max_short_side,
            "splits": {name: asdict(split) for name, split in self.splits.items()},
        }
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str) -> Manifest:
        try:
            body = json.loads(text)
            if body.get("format") != FORMAT:
                raise DataError(
                    f"{source}: format {body.get('format')!r} is not {FORMAT!r}; "
                    f"rerun `dt-data prepare`"
                )
            splits = {
                name: SplitEntry(
                    samples=int(split["samples"]),
                    shards=tuple(ShardEntry(**shard) for shard in split["shards"]),
                    skipped=tuple(split.get("skipped", ())),
                )
                for name, split in body["splits"].items()
            }
            return cls(
                classes=tuple(body["classes"]),
                splits=splits,
                max_short_side=int(body.get("max_short_side", 0)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DataError(f"{source}: not a valid shard manifest ({err})") from None

    @classmethod
    def load(cls, folder: Path) -> Manifest:
        return cls.from_json(*read_manifest(folder, "dataset", f"dt-data prepare SRC_DIR {folder}"))

    def split(self, name: str, folder: Path) -> SplitEntry:
        entry = self.splits.get(name)
        if entry is None or not entry.shards:
            raise DataError(f"{folder / MANIFEST_NAME} has no {name} shards")
        return entry


def read_manifest(folder: Path, what: str, prepare: str) -> tuple[str, str]:
    """The text of ``folder``'s manifest and its path (to name it in errors); a missing or
    unreadable one is one line saying to prepare the ``what`` (``prepare``: the command)."""
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise DataError(f"{path} does not exist: prepare the {what} with `{prepare}`")
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or "not UTF-8 text"
        raise DataError(f"{path}: cannot read it ({reason}); prepare the {what} again") from None


def shard_is_valid(path: Path, shard: ShardEntry) -> bool:
    """True when ``path`` holds exactly the bytes the manifest lists (size first: cheap)."""
    try:
        if path.stat().st_size != shard.bytes:
            return False
    except FileNotFoundError:
        return False
    return sha256_file(path) == shard.sha256
