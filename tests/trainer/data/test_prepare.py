import json
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import make_dataset
from trainer.common.files import sha256_file
from trainer.data.__main__ import main as data_main
from trainer.data.errors import DataError
from trainer.data.manifest import MANIFEST_NAME, Manifest
from trainer.data.prepare import prepare

QUIET = {"log": lambda _: None}


def _files(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_same_input_gives_byte_identical_shards_whatever_the_process_count(tmp_path, dataset):
    prepare(dataset, tmp_path / "a", shard_mb=0.03, processes=1, **QUIET)
    prepare(dataset, tmp_path / "b", shard_mb=0.03, processes=2, **QUIET)
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert len(a) > 4 and a == b


def test_manifest_lists_every_shard_with_its_size_count_and_checksum(shards):
    manifest = Manifest.load(shards)
    assert manifest.classes == ("class0", "class1", "class2")
    for split in ("train", "val"):
        entry = manifest.splits[split]
        assert entry.samples == 36 == sum(s.samples for s in entry.shards)
        assert len(entry.shards) > 1
        for shard in entry.shards:
            path = shards / shard.name
            assert path.stat().st_size == shard.bytes
            assert sha256_file(path) == shard.sha256
    assert sorted(p.name for p in shards.iterdir()) == sorted(
        [MANIFEST_NAME, *(s.name for s in manifest.shards)]
    )


def test_shards_use_webdataset_member_names_and_carry_labels(shards, dataset):
    manifest = Manifest.load(shards)
    with tarfile.open(shards / manifest.splits["train"].shards[0].name) as tar:
        names = tar.getnames()
        assert names[:2] == ["000000000.jpg", "000000000.cls"]
        assert names[2:4] == ["000000001.png", "000000001.cls"]
        member = tar.extractfile("000000000.jpg")
        assert member is not None
        first = sorted((dataset / "train" / "class0").iterdir())[0]
        assert member.read() == first.read_bytes()
        assert tar.getmember("000000000.jpg").mtime == 0


def test_flat_val_folder_with_a_labels_file(tmp_path):
    src = make_dataset(tmp_path / "src", per_class=4)
    val = src / "val"
    lines = []
    for folder in sorted(val.iterdir()):
        for image in sorted(folder.iterdir()):
            flat = val / f"{folder.name}_{image.name}"
            image.rename(flat)
            lines.append(f"{flat.stem} {folder.name}")
        folder.rmdir()
    (val / "labels.txt").write_text("\n".join(lines) + "\n")
    manifest = prepare(src, tmp_path / "out", processes=1, **QUIET).manifest
    assert manifest.splits["val"].samples == 12
    (val / "labels.txt").write_text("class1_img0 class9\n")
    with pytest.raises(DataError, match=r"labels.txt: class 'class9' for class1_img0"):
        prepare(src, tmp_path / "out2", processes=1, **QUIET)


def test_corrupt_images_are_skipped_counted_and_listed(tmp_path, dataset):
    (dataset / "train" / "class1" / "broken.JPEG").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    result = prepare(dataset, tmp_path / "out", processes=2, **QUIET)
    assert result.skipped == 1
    assert result.manifest.splits["train"].skipped == ("train/class1/broken.JPEG",)
    assert result.manifest.splits["train"].samples == 36


def test_strict_stops_at_a_corrupt_image_before_writing_anything(tmp_path, dataset):
    (dataset / "train" / "class2" / "cut.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(DataError, match=r"cannot decode image train/class2/cut.png.*--strict"):
        prepare(dataset, tmp_path / "out", strict=True, processes=1, **QUIET)
    assert not (tmp_path / "out").exists()


def test_bad_folders_are_named(tmp_path, dataset):
    with pytest.raises(DataError, match="missing/train does not exist"):
        prepare(tmp_path / "missing", tmp_path / "out", **QUIET)
    (tmp_path / "empty" / "train" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match=r"no \.jpg/\.jpeg/\.png images"):
        prepare(tmp_path / "empty", tmp_path / "out", **QUIET)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"holds 'notes\.txt', which prepare did not write"):
        prepare(dataset, busy, **QUIET)
    with pytest.raises(DataError, match="inside the source"):
        prepare(dataset, dataset / "out", **QUIET)
    with pytest.raises(DataError, match="shard_mb=0"):
        prepare(dataset, tmp_path / "out", shard_mb=0, **QUIET)


def test_rerun_with_bigger_shards_removes_the_old_ones(tmp_path, dataset, shards):
    before = len(Manifest.load(shards).shards)
    prepare(dataset, shards, shard_mb=64, processes=1, **QUIET)
    manifest = Manifest.load(shards)
    assert len(manifest.shards) == 2 < before
    assert sorted(p.name for p in shards.iterdir()) == [
        MANIFEST_NAME,
        "train-000000.tar",
        "val-000000.tar",
    ]


def test_cli_prepare_and_its_one_line_errors(tmp_path, dataset, capsys):
    run = [sys.executable, "-m", "trainer.data", "prepare"]
    ok = subprocess.run([*run, str(dataset), str(tmp_path / "out")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "train: 36 images in 1 shards" in ok.stdout
    assert json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["splits"]["val"]
    bad = subprocess.run(
        [*run, str(tmp_path / "nope"), str(tmp_path / "o")], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "nope/train does not exist" in bad.stderr
    # A missing argument, in process: argparse's one line (trainer.common.cli.OneLineParser),
    # which tests/ci/test_entry_points.py checks every command prints as a process.
    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:
        data_main(["prepare", str(dataset)])
    usage_stderr = capsys.readouterr().err
    assert usage.value.code == 2 and usage_stderr.count("\n") == 1
    assert "Traceback" not in bad.stderr + usage_stderr
