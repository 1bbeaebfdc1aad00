"""The token shard format ``prepare-text`` writes and the language-model loaders read: a folder of
``train-00000.bin``, ``val-00000.bin``, ... (raw little-endian token ids, the narrowest width
the vocabulary fits) and ``manifest.json``, last, listing each split's shards, token counts and
SHA-256s; the shards opened as memory maps, their sizes checked against it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trainer.data.errors import DataError
from trainer.data.manifest import MANIFEST_NAME, read_manifest

FORMAT = "distributed-training-tokens/1"


SHARD_SUFFIX = ".bin"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned little-endian dtype of 2 or 4 bytes that holds every id (bytes
    would fit uint8 were end-of-text not a 257th id: two bytes keep it apart, one reader)."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


@dataclass(frozen=True)
class TokenShard:
    name: str
    bytes: int
    tokens: int
    sha256: str


@dataclass(frozen=True)
class TokenSplit:
    tokens: int
    shards: tuple[TokenShard, ...]


@dataclass(frozen=True)
class TokenManifest:
    vocab_size: int
    dtype: str  # numpy's name: "uint16" or "uint32", always little-endian
    end_of_text: int
    # {"kind": "bytes"} or {"kind": "tokenizers", "sha256": ..., "end_of_text": "<|endoftext|>"};
    # the file's SHA-256, never its path, which differs between machines.
    tokenizer: dict[str, str]
    documents: int
    splits: dict[str, TokenSplit] = field(default_factory=dict)
    # Input files with no bytes, relative to the source: skipped (they hold no document).
    skipped_empty: tuple[str, ...] = ()

    def to_json(self) -> str:
        """Canonical text (sorted keys, no timestamps): the same input gives the same bytes."""
        body = {"format": FORMAT, **asdict(self)}
        body["skipped_empty"] = list(self.skipped_empty)
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str) -> TokenManifest:
        try:
            body = json.loads(text)
            if body.get("format") != FORMAT:
                raise DataError(
                    f"{source}: format {body.get('format')!r} is not {FORMAT!r}; prepare the "
                    f"text with `dt-data prepare-text`"
                )
            manifest = cls(
                vocab_size=int(body["vocab_size"]),
                dtype=str(body["dtype"]),
                end_of_text=int(body["end_of_text"]),
                tokenizer={str(k): str(v) for k, v in body["tokenizer"].items()},
                documents=int(body["documents"]),
                splits={
                    name: TokenSplit(
                        tokens=int(split["tokens"]),
                        shards=tuple(TokenShard(**shard) for shard in split["shards"]),
                    )
                    for name, split in body["splits"].items()
                },
                skipped_empty=tuple(body.get("skipped_empty", ())),
            )
            if manifest.dtype not in ("uint16", "uint32"):
                raise ValueError(f"dtype {manifest.dtype!r}")
            return manifest
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            if isinstance(err, DataError):
                raise
            raise DataError(f"{source}: not a valid token manifest ({err})") from None

    @classmethod
    def load(cls, folder: Path) -> TokenManifest:
        return cls.from_json(*read_manifest(folder, "text", f"dt-data prepare-text SRC {folder}"))

    def split(self, name: str, folder: Path) -> TokenSplit:
        entry = self.splits.get(name)
        if entry is None or not entry.tokens:
            raise DataError(f"{folder / MANIFEST_NAME} has no {name} tokens")
        return entry


def open_shards(folder: Path, manifest: TokenManifest, split: TokenSplit) -> list[np.ndarray]:
    dtype = np.dtype(manifest.dtype).newbyteorder("<")
    maps = []
    for shard in split.shards:
        path = folder / shard.name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise DataError(
                f"shard {path} is missing: stage the dataset again or rerun prepare-text"
            ) from None
        if size != shard.bytes or size != shard.tokens * dtype.itemsize:
            raise DataError(
                f"shard {path} has {size} bytes, the manifest lists {shard.bytes} for "
                f"{shard.tokens} tokens: stage the dataset again or rerun prepare-text"
            )
        maps.append(np.memmap(path, dtype=dtype, mode="r"))
    return maps
