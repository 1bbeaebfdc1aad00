"""``prepare``'s companion files fed malformed lines: a flat val/ folder's ``labels.txt`` and
ImageNet's ``LOC_val_solution.csv``. Every generated file holds one bad line among good ones;
``dt-data prepare`` must stop with exit 2 and one line naming the file, that
line's number and its value, before it writes anything."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PIL import Image

from trainer.data.__main__ import main

CLASSES = ("class0", "class1", "class2")
STEMS = tuple(f"val_{i:02d}" for i in range(6))
NAME = st.text(alphabet=string.ascii_letters + string.digits + "_-.", min_size=1, max_size=12)
SEPARATOR = st.sampled_from([" ", "  ", "\t", ",", ", "])
# tmp_path is shared by a test's examples: each example rewrites the one labels file.
EXAMPLES = settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _source(root: Path) -> Path:
    """train/<class>/ and a flat val/ of tiny PNGs (prepare reads no pixels before it fails)."""
    for name in CLASSES:
        (root / "train" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(root / "train" / name / "a.png")
    (root / "val").mkdir()
    for stem in STEMS:
        Image.new("RGB", (8, 8)).save(root / "val" / f"{stem}.png")
    return root


@pytest.fixture
def source(tmp_path) -> Path:
    return _source(tmp_path / "src")


@st.composite
def good_rows(draw) -> list[tuple[str, str]]:
    stems = draw(st.lists(st.sampled_from(STEMS), unique=True, max_size=len(STEMS) - 1))
    return [(stem, draw(st.sampled_from(CLASSES))) for stem in stems]


@st.composite
def labels_txt(draw) -> tuple[str, list[str], int, str]:
    """(the kind of fault, the file's lines, the bad line's number, what the error must quote
    of it)."""
    rows = draw(good_rows())
    lines = [f"{stem}{draw(SEPARATOR)}{label}" for stem, label in rows]
    unused = [stem for stem in STEMS if stem not in {s for s, _ in rows}]
    kind = draw(
        st.sampled_from(
            ["no class", "two classes", "unknown class", "unknown image"]
            + (["duplicate"] if rows else [])
        )
    )
    stem = draw(st.sampled_from(unused))
    if kind == "no class":
        bad = stem + draw(st.sampled_from(["", " ", ",", "\t", " , "]))
        quoted = stem
    elif kind == "two classes":
        bad = f"{stem} {draw(st.sampled_from(CLASSES))} {draw(st.sampled_from(CLASSES))}"
        quoted = stem
    elif kind == "unknown class":
        label = draw(NAME.filter(lambda name: name not in CLASSES))
        bad, quoted = f"{stem} {label}", repr(label)
    elif kind == "unknown image":
        missing = "missing_" + draw(NAME)
        bad, quoted = f"{missing} {draw(st.sampled_from(CLASSES))}", Path(missing).stem
    else:
        stem = draw(st.sampled_from([s for s, _ in rows]))
        bad, quoted = f"{stem} {draw(st.sampled_from(CLASSES))}", stem
    # A duplicate comes after the line it repeats; anything else may come anywhere.
    first = 1 + max((i for i, line in enumerate(lines) if line.startswith(stem)), default=-1)
    at = draw(st.integers(first if kind == "duplicate" else 0, len(lines)))
    lines.insert(at, bad)
    blanks = draw(st.integers(0, 2))  # blank lines before it still count
    return kind, [""] * blanks + lines, blanks + at + 1, quoted


@st.composite
def solution_csv(draw) -> tuple[str, list[str], int, str]:
    rows = draw(good_rows())
    lines = [f"{stem},{label} 1 2 30 40" for stem, label in rows]
    header = "ImageId,PredictionString"
    kind = draw(
        st.sampled_from(
            [
                "no header",
                "header lacks a column",
                "row lacks a column",
                "empty prediction",
                "unknown class id",
            ]
        )
    )
    unused = [stem for stem in STEMS if stem not in {s for s, _ in rows}]
    stem = draw(st.sampled_from(unused))
    if kind == "no header":
        good = f"{stem},{draw(st.sampled_from(CLASSES))} 1 2 3 4"
        return kind, [good, *lines], 1, "lacks ImageId"
    if kind == "header lacks a column":
        header = draw(
            st.sampled_from(
                ["ImageId", "PredictionString", "ImageId,Prediction", "Id,PredictionString"]
            )
        )
        return kind, [header, *lines], 1, "lacks "
    if kind == "row lacks a column":
        bad, quoted = stem, stem
    elif kind == "empty prediction":
        bad, quoted = f"{stem},{draw(st.sampled_from(['', ' ', '   ']))}", repr(stem)
    else:
        label = draw(NAME.filter(lambda name: name not in CLASSES))
        bad, quoted = f"{stem},{label} 0 0 9 9", repr(label)
    at = draw(st.integers(0, len(lines)))
    lines.insert(at, bad)
    return kind, [header, *lines], at + 2, quoted


def _prepare_fails(source: Path, tmp_path: Path, capsys) -> str:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["prepare", str(source), str(out), "--processes", "1"])
    captured = capsys.readouterr()
    assert exit_.value.code == 2, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert not out.exists()
    return lines[0]


@EXAMPLES
@given(case=labels_txt())
def test_a_malformed_labels_txt_line_is_named_with_its_number(source, tmp_path, capsys, case):
    kind, lines, number, quoted = case
    event(kind)
    (source / "val" / "labels.txt").write_text("\n".join(lines) + "\n")
    line = _prepare_fails(source, tmp_path, capsys)
    assert f"{source / 'val' / 'labels.txt'}: " in line, line
    assert f"line {number}" in line and quoted in line, (line, number)


@EXAMPLES
@given(case=solution_csv())
def test_a_malformed_solution_csv_line_is_named_with_its_number(source, tmp_path, capsys, case):
    kind, lines, number, quoted = case
    event(kind)
    (source / "val" / "LOC_val_solution.csv").write_text("\n".join(lines) + "\n")
    line = _prepare_fails(source, tmp_path, capsys)
    assert f"{source / 'val' / 'LOC_val_solution.csv'}: " in line, line
    assert f"line {number}" in line and quoted in line, (line, number)


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("labels.txt", b"val_00 class0\n\xff\xfe bad\n", "not UTF-8 text (byte 0xff"),
        (
            "LOC_val_solution.csv",
            b"ImageId,PredictionString\nval_00,\0class0\n",
            "'\\x00class0' for val_00 on line 2",
        ),
    ],
    ids=["latin-1 bytes", "NUL byte"],
)
def test_a_companion_file_that_is_not_text_is_one_line(
    source, tmp_path, capsys, name, data, message
):
    (source / "val" / name).write_bytes(data)
    line = _prepare_fails(source, tmp_path, capsys)
    assert name in line and message in line, line
