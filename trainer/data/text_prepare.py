"""``prepare-text``: plain-text files become token shards plus a manifest
(``trainer.data.token_shards``). Documents, splits, tokenizers and id widths: docs/data.md, "How
it works".
"""

from __future__ import annotations

import codecs
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.common.files import (
    OutputError,
    fsync_folder,
    open_atomic,
    partial_path,
    remove_partials,
    sha256_file,
    write_atomic,
)
from trainer.data.errors import DataError
from trainer.data.manifest import MANIFEST_NAME, MAX_SHARD_MB
from trainer.data.token_shards import (
    SHARD_SUFFIX,
    TokenManifest,
    TokenShard,
    TokenSplit,
    token_dtype,
)

DEFAULT_SHARD_MB = 64
DEFAULT_VAL_FRACTION = 0.01
BYTE_VOCAB = 257
BYTE_END_OF_TEXT = 256
# Names tokenizers give their end-of-text token (GPT-2/GPT-NeoX, Llama 3, SentencePiece models).
END_OF_TEXT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[EOS]")
_UTF8_BOM = b"\xef\xbb\xbf"
# Characters per encode_batch call: enough work for the tokenizer's threads, bounded memory.
_BATCH_BYTES = 16 << 20
# Bytes read from a source file at a time: a piece is tokenized on its own (cut at a line end).
_PIECE_BYTES = 16 << 20
_COPY_TOKENS = 1 << 22


# --- tokenizers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TextTokenizer:
    vocab_size: int
    end_of_text: int
    description: dict[str, str]  # what the manifest records
    encode_batch: Callable[[list[str]], list[np.ndarray]]


def _encode_bytes(texts: list[str]) -> list[np.ndarray]:
    return [np.frombuffer(text.encode(), dtype=np.uint8) for text in texts]


def byte_tokenizer() -> TextTokenizer:
    return TextTokenizer(BYTE_VOCAB, BYTE_END_OF_TEXT, {"kind": "bytes"}, _encode_bytes)


def load_tokenizer(path: Path) -> TextTokenizer:
    """A ``tokenizer.json`` (the ``tokenizers`` library's format) from a file; nothing is
    downloaded."""
    from tokenizers import Tokenizer  # only prepare-text with --tokenizer needs it

    if not path.is_file():
        raise DataError(
            f"tokenizer {path} is not a file: give a tokenizer.json saved with "
            f"tokenizers' Tokenizer.save()"
        )
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a bare Exception for every parse error
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(
            f"tokenizer {path} is not a valid tokenizer.json ({reason}): give a file saved "
            f"with tokenizers' Tokenizer.save()"
        ) from None
    found = [(name, tokenizer.token_to_id(name)) for name in END_OF_TEXT_NAMES]
    end_name, end_id = next(((n, i) for n, i in found if i is not None), (None, None))
    if end_name is None or end_id is None:
        raise DataError(
            f"tokenizer {path} has no end-of-text token ({', '.join(END_OF_TEXT_NAMES)}): add "
            f"one with add_special_tokens(['<|endoftext|>']) and save it again"
        )
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    # Text that spells a special token ("<|endoftext|>" in a page about tokenizers) is tokenized
    # as the characters it is: only prepare-text itself ends a document.
    tokenizer.encode_special_tokens = True

    def encode_batch(texts: list[str]) -> list[np.ndarray]:
        # No special tokens: a post-processor's [CLS]/[SEP] or <s> would be stored as text.
        encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(encoding.ids, dtype=np.int64) for encoding in encodings]

    description = {"kind": "tokenizers", "sha256": sha256_file(path), "end_of_text": end_name}
    return TextTokenizer(max(vocab_size, end_id + 1), end_id, description, encode_batch)


# --- reading the source ---------------------------------------------------------------------


def find_text_files(src: Path) -> list[Path]:
    """``src`` itself, or every ``*.txt`` under it in sorted order of the relative path."""
    if not src.exists():
        raise DataError(f"source {src} does not exist: give a text file or a folder of .txt files")
    if src.is_file():
        return [src]
    files = sorted(
        (path for path in src.rglob("*.txt") if path.is_file()),
        key=lambda path: path.relative_to(src).as_posix(),
    )
    if not files:
        raise DataError(f"source {src} holds no .txt files: give a text file or a folder of them")
    return files


def text_pieces(path: Path, piece_bytes: int = _PIECE_BYTES) -> Iterator[str]:
    """The text of ``path`` (UTF-8, a leading byte-order mark dropped) in pieces of about
    ``piece_bytes``, each ending at a line end where the line allows (a corpus may be one file
    of many gigabytes: it is never held whole), or a DataError naming what makes it unusable:
    NUL bytes (a binary or UTF-16 file) or bytes that are not UTF-8, with their offset."""
    try:
        handle = open(path, "rb")  # noqa: SIM115  # closed below, read in pieces
    except OSError as err:
        raise DataError(f"{path}: cannot be read ({err.strerror or err})") from None
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # of the next block's first byte in the file
    carry = ""  # the text after the last line end seen
    with handle:
        while True:
            try:
                # The first read takes at least a byte-order mark's length.
                block = handle.read(piece_bytes if offset else max(piece_bytes, 3))
            except OSError as err:
                raise DataError(f"{path}: cannot be read ({err.strerror or err})") from None
            end = not block
            if offset == 0:
                if block[:2] in (b"\xff\xfe", b"\xfe\xff"):
                    raise DataError(
                        f"{path}: is UTF-16 text: convert it to UTF-8, e.g. "
                        f"`iconv -f UTF-16 -t UTF-8`"
                    )
                # The byte-order mark says how the file is encoded; it is not part of the text.
                bom = len(_UTF8_BOM) if block.startswith(_UTF8_BOM) else 0
                block, offset = block[bom:], bom
            nul = block.find(b"\0")
            if nul >= 0:
                raise DataError(
                    f"{path}: byte {offset + nul} is NUL, so this is a binary file, not text: "
                    f"remove it from the source"
                )
            pending = len(decoder.getstate()[0])  # bytes of a character the last block cut
            try:
                text = carry + decoder.decode(block, final=end)
            except UnicodeDecodeError as err:
                at = offset - pending + err.start
                raise DataError(
                    f"{path}: byte {at} (0x{err.object[err.start]:02x}) is not UTF-8: convert "
                    f"the file, e.g. `iconv -f LATIN1 -t UTF-8` if it is Latin-1"
                ) from None
            offset += len(block)
            if end:
                if text:
                    yield text
                return
            # Whole lines go to the tokenizer; a line longer than a piece is cut where it is.
            cut = text.rfind("\n") + 1 or len(text)
            carry = text[cut:]
            if cut:
                yield text[:cut]


def _documents(
    files: list[Path], src: Path, tokenizer: TextTokenizer, skipped: list[str]
) -> Iterator[tuple[np.ndarray, bool]]:
    """The documents (non-empty files) in file order as (tokens, whether they end a document),
    the last piece of each with end-of-text appended."""
    end = np.array([tokenizer.end_of_text], dtype=np.int64)
    batch: list[str] = []
    ends: list[bool] = []
    size = 0

    def flush() -> Iterator[tuple[np.ndarray, bool]]:
        for tokens, last in zip(tokenizer.encode_batch(batch), ends, strict=True):
            tokens = tokens.astype(np.int64)
            yield (np.concatenate([tokens, end]) if last else tokens), last
        batch.clear()
        ends.clear()

    for path in files:
        if path.stat().st_size == 0:
            skipped.append(path.relative_to(src).as_posix() if path != src else path.name)
            continue
        pieces = text_pieces(path, _PIECE_BYTES)
        piece: str | None = next(pieces, "")  # a byte-order mark alone: an empty document
        while piece is not None:
            following = next(pieces, None)
            batch.append(piece)
            ends.append(following is None)
            size += len(piece)
            if size >= _BATCH_BYTES:
                yield from flush()
                size = 0
            piece = following
    yield from flush()


# --- writing --------------------------------------------------------------------------------


def _check_output_folder(out: Path, src: Path) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"output folder {out} is a file: pick a folder")
    if src.is_dir() and out.resolve().is_relative_to(src.resolve()):
        raise DataError(f"output folder {out} is inside the source {src}: pick a folder outside it")
    if out.is_dir():
        foreign = sorted(
            entry.name
            for entry in os.scandir(out)
            if entry.name != MANIFEST_NAME
            and not entry.name.endswith(SHARD_SUFFIX)
            and ".partial-" not in entry.name
        )
        if foreign:
            raise DataError(
                f"output folder {out} holds {foreign[0]!r}, which prepare-text did not write: "
                f"pick an empty folder"
            )


def _write_shards(
    stream: np.ndarray, split: str, out: Path, tokens_per_shard: int
) -> tuple[TokenShard, ...]:
    shards = []
    for number, start in enumerate(range(0, len(stream), tokens_per_shard)):
        path = out / f"{split}-{number:05d}{SHARD_SUFFIX}"
        part = stream[start : start + tokens_per_shard]
        with open_atomic(path) as file:
            for offset in range(0, len(part), _COPY_TOKENS):
                file.write(part[offset : offset + _COPY_TOKENS].tobytes())
        shards.append(TokenShard(path.name, path.stat().st_size, len(part), sha256_file(path)))
    return tuple(shards)


@dataclass(frozen=True)
class PrepareTextResult:
    manifest: TokenManifest
    skipped_empty: int


def prepare_text(
    src: Path,
    out: Path,
    *,
    tokenizer: Path | None = None,
    shard_mb: float = DEFAULT_SHARD_MB,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    log: Callable[[str], None] = print,
) -> PrepareTextResult:
    """``_prepare_text``; a folder or disk that cannot take the output (read-only, immutable,
    full, a file in the way) is an ``OutputError`` naming the path. Sources are read through
    ``text_pieces``, which names an unreadable one as a ``DataError``: any ``OSError`` left is a
    write's."""
    try:
        return _prepare_text(
            src, out, tokenizer=tokenizer, shard_mb=shard_mb, val_fraction=val_fraction, log=log
        )
    except OSError as err:
        raise OutputError.of(err, out) from None


def _prepare_text(
    src: Path,
    out: Path,
    *,
    tokenizer: Path | None,
    shard_mb: float,
    val_fraction: float,
    log: Callable[[str], None],
) -> PrepareTextResult:
    """Tokenize ``src`` (a text file, or a folder searched for ``*.txt``) into shards of at most
    ``shard_mb`` MB in ``out``. Empty files are skipped and counted; no text at all, a binary or
    non-UTF-8 file stops the run naming the file, before ``out`` is changed.

    Tokens are first appended to one hidden temp file in ``out`` (memory stays bounded and the
    split point is known only at the end), then cut into shards, each written under a temp
    name and renamed. The old manifest is removed before the first shard is replaced and the new
    one written last, so a folder with a manifest is always complete; a rerun with the same
    input writes the same bytes."""
    _check_numbers(shard_mb, val_fraction)
    _check_output_folder(out, src)
    text_tokenizer = load_tokenizer(tokenizer) if tokenizer is not None else byte_tokenizer()
    dtype = token_dtype(text_tokenizer.vocab_size)
    files = find_text_files(src)

    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    remove_partials(out)
    stream_path = partial_path(out / "tokens.stream")
    skipped: list[str] = []
    try:
        documents = _write_stream(stream_path, files, src, text_tokenizer, tokenizer, skipped)
        total = stream_path.stat().st_size // dtype.itemsize
        val_tokens = _val_tokens(total, val_fraction, src, len(skipped))
        splits = _write_splits(stream_path, dtype, total - val_tokens, out, shard_mb)
    except BaseException:
        stream_path.unlink(missing_ok=True)
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    stream_path.unlink()

    manifest = TokenManifest(
        vocab_size=text_tokenizer.vocab_size,
        dtype=dtype.name,
        end_of_text=text_tokenizer.end_of_text,
        tokenizer=text_tokenizer.description,
        documents=documents,
        splits=splits,
        skipped_empty=tuple(skipped),
    )
    _write_manifest(out, manifest)
    _report(manifest, out, log)
    return PrepareTextResult(manifest, len(skipped))


def _check_numbers(shard_mb: float, val_fraction: float) -> None:
    if not 0 < shard_mb <= MAX_SHARD_MB:  # NaN too
        raise DataError(
            f"shard_mb={shard_mb}: must be a positive number of MB, {MAX_SHARD_MB:g} at most"
        )
    if not 0 <= val_fraction < 1:
        raise DataError(f"val_fraction={val_fraction}: must be at least 0 and below 1")


def _write_stream(
    stream_path: Path,
    files: list[Path],
    src: Path,
    text_tokenizer: TextTokenizer,
    tokenizer: Path | None,
    skipped: list[str],
) -> int:
    """Append every document's tokens to ``stream_path``; the number of documents. Empty files
    are added to ``skipped``."""
    dtype = token_dtype(text_tokenizer.vocab_size)
    documents = 0
    with open(stream_path, "wb") as stream_file:
        for tokens, ends_document in _documents(files, src, text_tokenizer, skipped):
            if len(tokens) and int(tokens.max()) >= text_tokenizer.vocab_size:
                raise DataError(
                    f"tokenizer {tokenizer} gave id {int(tokens.max())}, outside its "
                    f"vocabulary of {text_tokenizer.vocab_size}: check the tokenizer.json"
                )
            documents += ends_document
            stream_file.write(tokens.astype(dtype).tobytes())
    return documents


def _val_tokens(total: int, val_fraction: float, src: Path, empty_files: int) -> int:
    """How many of the stream's ``total`` tokens, its last, go to ``val``."""
    if not total:
        raise DataError(
            f"source {src} has no text: {empty_files} empty file(s), nothing to tokenize"
        )
    val_tokens = math.ceil(total * val_fraction) if val_fraction else 0
    if val_tokens >= total:
        raise DataError(
            f"source {src}: {total} tokens leave none for training with "
            f"val_fraction={val_fraction}: give more text or a smaller val fraction"
        )
    return val_tokens


def _write_splits(
    stream_path: Path, dtype: np.dtype, train_tokens: int, out: Path, shard_mb: float
) -> dict[str, TokenSplit]:
    """The stream cut into ``train`` (its first ``train_tokens``) and ``val`` shards."""
    # A folder with a manifest is complete: the old one goes before the first shard changes.
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    stream = np.memmap(stream_path, dtype=dtype, mode="r")
    tokens_per_shard = max(1, int(shard_mb * (1 << 20)) // dtype.itemsize)
    parts = {"train": stream[:train_tokens], "val": stream[train_tokens:]}
    return {
        split: TokenSplit(len(part), _write_shards(part, split, out, tokens_per_shard))
        for split, part in parts.items()
        if len(part)
    }


def _write_manifest(out: Path, manifest: TokenManifest) -> None:
    """The manifest, written last, then the shards of an earlier run it no longer lists go."""
    write_atomic(out / MANIFEST_NAME, manifest.to_json().encode())
    listed = {shard.name for split in manifest.splits.values() for shard in split.shards}
    for stale in set(os.listdir(out)) - listed - {MANIFEST_NAME}:
        (out / stale).unlink()
    fsync_folder(out)


def _report(manifest: TokenManifest, out: Path, log: Callable[[str], None]) -> None:
    for split, entry in manifest.splits.items():
        log(f"{split}: {entry.tokens} tokens in {len(entry.shards)} shards")
    vocabulary = f"vocabulary of {manifest.vocab_size} ({manifest.dtype} ids)"
    log(f"{manifest.documents} documents, {vocabulary}")
    if manifest.skipped_empty:
        log(f"skipped {len(manifest.skipped_empty)} empty file(s), listed in {out / MANIFEST_NAME}")


# --- reading prepared tokens ----------------------------------------------------------------
