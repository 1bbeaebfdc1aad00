import json
import pickle
import re
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer.common.files import sha256_file
from trainer.data.__main__ import main
from trainer.data.errors import DataError
from trainer.data.manifest import MANIFEST_NAME
from trainer.data.text_prepare import BYTE_END_OF_TEXT, prepare_text, text_pieces
from trainer.data.token_shards import TokenManifest, open_shards
from trainer.data.token_windows import SyntheticTokens, TokenDataset

QUIET = {"log": lambda _: None}
DOCS = {
    "a.txt": "The first document.\nIt has two lines.\n",
    "sub/b.txt": "Zweites Dokument: Grüße, naïve café ✓\n",
    "sub/c.txt": "third",
}


def _write(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def _byte_documents(tokens: np.ndarray) -> list[str]:
    """Byte-level tokens -> the documents they hold (each one ends with end-of-text)."""
    assert tokens[-1] == BYTE_END_OF_TEXT
    ends = np.flatnonzero(tokens == BYTE_END_OF_TEXT)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [bytes(tokens[s:e].astype(np.uint8)).decode() for s, e in zip(starts, ends, strict=True)]


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_byte_tokens_round_trip_with_documents_ended_by_end_of_text(tmp_path):
    src = _write(tmp_path / "src", {**DOCS, "empty.txt": "", "notes.md": "not a .txt"})
    result = prepare_text(src, tmp_path / "out", shard_mb=1, val_fraction=0, **QUIET)
    manifest = result.manifest
    assert (manifest.vocab_size, manifest.dtype, manifest.end_of_text) == (257, "uint16", 256)
    assert manifest.tokenizer == {"kind": "bytes"}
    assert manifest.documents == 3 and list(manifest.splits) == ["train"]
    assert result.skipped_empty == 1 and manifest.skipped_empty == ("empty.txt",)
    # Sorted by relative path; the .md file is not read.
    assert _byte_documents(read_split(tmp_path / "out", "train")) == list(DOCS.values())


def test_a_single_file_source_and_a_leading_byte_order_mark(tmp_path):
    src = tmp_path / "book.text"
    src.write_bytes(b"\xef\xbb\xbfOnce upon a time")
    prepare_text(src, tmp_path / "out", val_fraction=0, **QUIET)
    assert _byte_documents(read_split(tmp_path / "out", "train")) == ["Once upon a time"]


def test_same_input_gives_the_same_bytes_and_a_rerun_replaces_stale_shards(tmp_path):
    src = _write(tmp_path / "src", DOCS)
    prepare_text(src, tmp_path / "a", shard_mb=40 / 2**20, val_fraction=0.2, **QUIET)
    prepare_text(src, tmp_path / "b", shard_mb=40 / 2**20, val_fraction=0.2, **QUIET)
    first = _files(tmp_path / "a")
    assert first == _files(tmp_path / "b") and len(first) > 3
    # Rerun in place with bigger shards: the old shard names the manifest drops are removed.
    prepare_text(src, tmp_path / "a", shard_mb=1, val_fraction=0.2, **QUIET)
    assert sorted(_files(tmp_path / "a")) == [MANIFEST_NAME, "train-00000.bin", "val-00000.bin"]


def test_manifest_lists_sizes_counts_and_checksums_and_val_is_the_stream_end(tmp_path):
    src = _write(tmp_path / "src", DOCS)
    out = tmp_path / "out"
    manifest = prepare_text(src, out, shard_mb=50 / 2**20, val_fraction=0.1, **QUIET).manifest
    stream = np.concatenate([read_split(out, "train"), read_split(out, "val")])
    assert _byte_documents(stream) == list(DOCS.values())
    total = len(stream)
    assert manifest.splits["val"].tokens == -(-total // 10)
    for split in manifest.splits.values():
        assert split.tokens == sum(shard.tokens for shard in split.shards)
        for shard in split.shards:
            assert shard.tokens <= 25 and shard.bytes == 2 * shard.tokens
            assert (out / shard.name).stat().st_size == shard.bytes
            assert sha256_file(out / shard.name) == shard.sha256
    assert TokenManifest.load(out) == manifest
    assert (
        json.loads((out / MANIFEST_NAME).read_text())["format"] == "distributed-training-tokens/1"
    )


def test_token_dataset_windows_are_consecutive_and_targets_shifted_by_one(tmp_path):
    text = "".join(chr(ord("a") + i % 26) for i in range(100))
    src = _write(tmp_path / "src", {"alphabet.txt": text})
    # 30-token shards: windows of 10 + 1 tokens that start in one shard end in the next.
    prepare_text(src, tmp_path / "out", shard_mb=60 / 2**20, val_fraction=0, **QUIET)
    stream = read_split(tmp_path / "out", "train").astype(np.int64)
    assert len(stream) == 101
    dataset = TokenDataset(tmp_path / "out", "train", context=10, check_sha256=True)
    assert len(dataset) == 10 and dataset.vocab_size == 257  # (101 - 1) // 10
    for index in range(len(dataset)):
        inputs, targets = dataset[index]
        assert inputs.dtype == targets.dtype == torch.int64
        assert inputs.tolist() == stream[index * 10 : index * 10 + 10].tolist()
        assert targets.tolist() == stream[index * 10 + 1 : index * 10 + 11].tolist()
    # Window 2 is tokens 20..30; shard 0 holds 0..29, so its last target comes from shard 1.
    assert dataset[2][1][-1].item() == stream[30] == ord("e")
    assert dataset[9][1][-1].item() == BYTE_END_OF_TEXT  # the last token is used
    with pytest.raises(IndexError):
        dataset[10]


def test_token_dataset_pickles_without_its_data(tmp_path):
    # DataLoader workers receive the dataset pickled: paths, not a copy of every token.
    src = _write(tmp_path / "src", {"text.txt": "x" * 5000})
    prepare_text(src, tmp_path / "out", val_fraction=0, **QUIET)
    dataset = TokenDataset(tmp_path / "out", "train", context=16)
    first = dataset[5]  # maps the shards in this process
    data = pickle.dumps(dataset)
    assert len(data) < 5000
    copy = pickle.loads(data)
    assert all(torch.equal(a, b) for a, b in zip(copy[5], first, strict=True))


def test_token_dataset_names_a_shard_whose_size_is_wrong(tmp_path):
    src = _write(tmp_path / "src", DOCS)
    out = tmp_path / "out"
    prepare_text(src, out, val_fraction=0, **QUIET)
    with open(out / "train-00000.bin", "ab") as shard:
        shard.write(b"\0\0")
    with pytest.raises(DataError, match=r"shard .*train-00000.bin has \d+ bytes, the manifest"):
        TokenDataset(out, "train", context=4)
    (out / "train-00000.bin").unlink()
    with pytest.raises(DataError, match=r"train-00000.bin is missing"):
        TokenDataset(out, "train", context=4)
    with pytest.raises(DataError, match="has no val tokens"):
        TokenDataset(out, "val", context=4)


def test_an_image_manifest_is_not_a_token_manifest(tmp_path):
    (tmp_path / MANIFEST_NAME).write_text('{"format": "distributed-training-shards/1"}')
    with pytest.raises(DataError, match="prepare-text"):
        TokenDataset(tmp_path, "train", context=4)


def test_synthetic_tokens_are_deterministic_per_index_and_in_range():
    dataset = SyntheticTokens(size=10, context=32, vocab_size=50, seed=3)
    inputs, targets = dataset[7]
    again = SyntheticTokens(size=10, context=32, vocab_size=50, seed=3)[7]
    assert torch.equal(inputs, again[0]) and torch.equal(targets, again[1])
    assert torch.equal(inputs[1:], targets[:-1]) and inputs.dtype == torch.int64
    assert not torch.equal(inputs, dataset[6][0])
    assert not torch.equal(inputs, SyntheticTokens(10, 32, 50, seed=4)[7][0])
    assert int(inputs.min()) >= 0 and int(inputs.max()) < 50 and len(dataset) == 10


def _train_tokenizer(path: Path):
    """A small byte-level BPE trained in memory on a few sentences: no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(list(DOCS.values()) * 3, trainer)
    tokenizer.save(str(path))
    return tokenizer


def test_a_tokenizer_json_is_used_with_its_end_of_text_token(tmp_path):
    tokenizer = _train_tokenizer(tmp_path / "tokenizer.json")
    docs = {**DOCS, "d.txt": "quoting <|endoftext|> is text"}
    src = _write(tmp_path / "src", docs)
    out = tmp_path / "out"
    kwargs = {"tokenizer": tmp_path / "tokenizer.json", "val_fraction": 0, **QUIET}
    manifest = prepare_text(src, out, **kwargs).manifest
    end = tokenizer.token_to_id("<|endoftext|>")
    assert manifest.end_of_text == end and manifest.vocab_size == tokenizer.get_vocab_size()
    assert manifest.tokenizer == {
        "kind": "tokenizers",
        "sha256": sha256_file(tmp_path / "tokenizer.json"),
        "end_of_text": "<|endoftext|>",
    }
    tokens = read_split(out, "train").tolist()
    # One end-of-text per document: the one quoted in d.txt is tokenized as its characters.
    assert tokens.count(end) == 4 and tokens[-1] == end
    ends = [i for i, token in enumerate(tokens) if token == end]
    starts = [-1, *ends[:-1]]
    decoded = [tokenizer.decode(tokens[s + 1 : e]) for s, e in zip(starts, ends, strict=True)]
    assert decoded == [docs[name] for name in sorted(docs)]


def test_a_tokenizer_without_an_end_of_text_token_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(
        str(tmp_path / "tokenizer.json")
    )
    src = _write(tmp_path / "src", DOCS)
    with pytest.raises(DataError, match=r"has no end-of-text token .*add_special_tokens"):
        prepare_text(src, tmp_path / "out", tokenizer=tmp_path / "tokenizer.json", **QUIET)


BAD_INPUTS = {
    "binary file": ({"a.txt": "fine", "b.txt": b"GIF89a\0\0\1"}, r"b.txt: byte 6 is NUL"),
    "empty input": ({"a.txt": "", "sub/b.txt": ""}, r"has no text: 2 empty file\(s\)"),
    "latin-1": (
        {"a.txt": "caf\xe9".encode("latin-1")},
        r"a.txt: byte 3 \(0xe9\) is not UTF-8.*iconv",
    ),
    "utf-16": ({"a.txt": "hi".encode("utf-16")}, r"a.txt: is UTF-16 text.*iconv"),
    "no text files": ({"a.md": "text"}, r"holds no .txt files"),
}


def _cli(capsys, *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare-text", *argv])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return int(exit_info.value.code or 0), err


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_text_input_is_one_line_exit_2_and_leaves_nothing(tmp_path, capsys, case):
    files, message = BAD_INPUTS[case]
    src = _write(tmp_path / "src", files)
    code, err = _cli(capsys, str(src), str(tmp_path / "out"))
    assert code == 2 and err.startswith("error: ")
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_bad_input_leaves_an_earlier_complete_output_as_it_was(tmp_path, capsys):
    src = _write(tmp_path / "src", DOCS)
    out = tmp_path / "out"
    prepare_text(src, out, val_fraction=0.1, **QUIET)
    before = _files(out)
    (src / "z.txt").write_bytes(b"\xff\xfe\0")
    code, err = _cli(capsys, str(src), str(out))
    assert code == 2 and "z.txt" in err
    assert _files(out) == before and not list(out.glob(".*"))


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing src", r"source .*nowhere does not exist"),
        ("garbage tokenizer", r"tokenizer .*tokenizer.json is not a valid tokenizer.json"),
        ("missing tokenizer", r"tokenizer .*absent.json is not a file"),
        ("out is a file", r"output folder .*out is a file"),
        ("out holds other files", r"holds 'photo.jpg', which prepare-text did not write"),
        ("val fraction 1", r"--val-fraction: '1': give a number in \[0, 1\)"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(tmp_path, capsys, setup, message):
    src = _write(tmp_path / "src", DOCS)
    out = tmp_path / "out"
    argv = [str(src), str(out)]
    if setup == "missing src":
        argv[0] = str(tmp_path / "nowhere")
    elif setup == "garbage tokenizer":
        (tmp_path / "tokenizer.json").write_text("{not json")
        argv += ["--tokenizer", str(tmp_path / "tokenizer.json")]
    elif setup == "missing tokenizer":
        argv += ["--tokenizer", str(tmp_path / "absent.json")]
    elif setup == "out is a file":
        out.write_text("x")
    elif setup == "out holds other files":
        out.mkdir()
        (out / "photo.jpg").write_bytes(b"x")
    else:
        argv += ["--val-fraction", "1"]
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else None
    code, err = _cli(capsys, *argv)
    assert code == 2
    assert re.search(message, err), err
    assert (sorted(p.name for p in out.iterdir()) if out.is_dir() else None) == before


@settings(
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    # Raw bytes are mostly not UTF-8; encoded text (NUL included) reaches the success path too.
    st.lists(
        st.one_of(st.binary(max_size=64), st.text(max_size=32).map(str.encode)),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([0, 0.3]),
)
def test_random_bytes_either_round_trip_or_raise_data_error(contents, val_fraction):
    with tempfile.TemporaryDirectory() as root:
        src = _write(Path(root) / "src", {f"f{i}.txt": data for i, data in enumerate(contents)})
        out = Path(root) / "out"
        try:
            prepare_text(src, out, shard_mb=16 / 2**20, val_fraction=val_fraction, **QUIET)
        except DataError as err:
            assert "\n" not in str(err)
            assert not out.exists()
            return
        manifest = TokenManifest.load(out)
        stream = np.concatenate([read_split(out, split) for split in manifest.splits])
        expected = [data.removeprefix(b"\xef\xbb\xbf").decode() for data in contents if data]
        assert _byte_documents(stream) == expected


# --- a source read in pieces ---------------------------------------------------------------


@settings(max_examples=150)
@given(
    # Multi-byte characters, line ends and long lines, read in pieces of a few bytes.
    st.text(alphabet=st.sampled_from("ab\néü✓𝄞 "), max_size=80),
    st.booleans(),
    st.integers(min_value=1, max_value=9),
)
def test_pieces_join_to_the_whole_text_and_end_at_line_ends(text, bom, piece_bytes):
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "a.txt"
        path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
        pieces = list(text_pieces(path, piece_bytes))
    assert "".join(pieces) == text
    assert all(pieces)
    # Every piece but the last ends a line, unless a line was longer than a piece.
    for piece in pieces[:-1]:
        assert piece.endswith("\n") or "\n" not in piece


@settings(max_examples=100)
@given(
    st.text(alphabet=st.sampled_from("ab\né✓"), min_size=1, max_size=60),
    st.data(),
    st.sampled_from([b"\xff", b"\xc3", b"\x80", b"\xe2\x9c"]),
    st.integers(min_value=1, max_value=9),
)
def test_a_byte_that_is_not_utf8_is_named_at_its_offset_in_the_file(text, data, bad, piece_bytes):
    encoded = text.encode()
    # Between two characters, where the bad byte starts an invalid sequence.
    starts = [i for i in range(len(encoded) + 1) if i == len(encoded) or encoded[i] & 0xC0 != 0x80]
    at = data.draw(st.sampled_from(starts))
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "a.txt"
        path.write_bytes(encoded[:at] + bad + b"\n" + encoded[at:])
        with pytest.raises(DataError) as failure:
            list(text_pieces(path, piece_bytes))
    assert f"a.txt: byte {at} (0x{bad[0]:02x}) is not UTF-8" in str(failure.value)


def test_a_large_file_is_never_held_whole(tmp_path):
    path = tmp_path / "corpus.txt"
    line = "a line of the corpus, with a café in it\n"
    path.write_text(line * (24 * 2**20 // len(line)))  # about 24 MB
    tracemalloc.start()
    try:
        size = sum(len(piece) for piece in text_pieces(path, 1 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size == path.stat().st_size - path.read_text().count("é")  # characters, not bytes
    assert peak < 8 * 2**20, f"held {peak / 2**20:.1f} MB while reading pieces of 1 MB"


def test_pieces_give_the_same_shards_as_whole_files(tmp_path, monkeypatch):
    src = _write(tmp_path / "src", {**DOCS, "long.txt": "line of text\n" * 200})
    prepare_text(src, tmp_path / "whole", shard_mb=0.001, **QUIET)
    monkeypatch.setattr("trainer.data.text_prepare._PIECE_BYTES", 7)
    prepare_text(src, tmp_path / "pieces", shard_mb=0.001, **QUIET)
    whole, pieces = TokenManifest.load(tmp_path / "whole"), TokenManifest.load(tmp_path / "pieces")
    assert pieces == whole and pieces.documents == 4
    for shard in (tmp_path / "whole").glob("*.bin"):
        assert (tmp_path / "pieces" / shard.name).read_bytes() == shard.read_bytes()


def read_split(folder: Path, split: str) -> np.ndarray:
    """Every token of ``split`` in order, in memory."""
    manifest = TokenManifest.load(folder)
    maps = open_shards(folder, manifest, manifest.split(split, folder))
    return np.concatenate([np.asarray(m) for m in maps])
