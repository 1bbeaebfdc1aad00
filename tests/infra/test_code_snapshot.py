"""A job's code folder as a snapshot (infra/code_snapshot.py), built in real git repositories:
tracked files only, the same bytes and SHA-256 whatever the files' times, owners or checkout,
a new hash for any change to what runs, and one-line refusals for a folder that cannot be one."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from infra.code_snapshot import SnapshotError, snapshot


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    (root / "job" / "pkg").mkdir(parents=True)
    (root / "job" / "train.py").write_text("print('train')\n")
    (root / "job" / "run.sh").write_text("#!/bin/sh\n")
    (root / "job" / "run.sh").chmod(0o755)
    (root / "job" / "pkg" / "model.py").write_text("X = 1\n")
    (root / "job" / "requirements.txt").write_text("tqdm==4.67.1\n")
    (root / "other.py").write_text("")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "code")
    return root


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {info.name: info for info in tar.getmembers()}


def test_the_snapshot_holds_the_tracked_files_with_fixed_times_owners_and_modes(repo):
    (repo / "job" / "notes.txt").write_text("untracked\n")  # never shipped
    (repo / "job" / "__pycache__").mkdir()
    (repo / "job" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    snap = snapshot("job", repo)
    members = _members(snap.data)
    assert sorted(members) == ["pkg/model.py", "requirements.txt", "run.sh", "train.py"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members.values()} == {
        (0, 0, 0, "", "")
    }
    assert members["run.sh"].mode == 0o755 and members["train.py"].mode == 0o644
    assert snap.files == 4 and snap.requirements == (repo / "job" / "requirements.txt").read_text()
    assert snap.blob_name == f"{snap.sha256}.tar.gz"


def test_the_hash_is_the_same_for_another_checkout_with_other_times_and_owners(repo, tmp_path):
    first = snapshot("job", repo)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    for path in (clone / "job").rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    os.umask(0o022)
    again = snapshot("job", clone)
    assert (again.sha256, again.data) == (first.sha256, first.data)


def test_any_change_to_what_runs_is_a_new_hash(repo):
    before = snapshot("job", repo).sha256
    (repo / "job" / "train.py").write_text("print('changed')\n")  # uncommitted: what up sees
    changed = snapshot("job", repo).sha256
    assert changed != before
    (repo / "job" / "train.py").chmod(0o755)
    assert snapshot("job", repo).sha256 not in (before, changed)


@pytest.mark.parametrize(
    ("folder", "expected"),
    [
        ("missing", "no such folder; give a folder of the repository"),
        ("..", "outside the repository; give a folder inside it"),
        ("job/../../", "outside the repository; give a folder inside it"),
        ("empty", "git tracks no file there; git add the script, then commit"),
    ],
)
def test_a_folder_that_cannot_be_a_snapshot_is_refused_in_one_line(repo, folder, expected):
    (repo / "empty").mkdir()
    with pytest.raises(SnapshotError) as refused:
        snapshot(folder, repo)
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)


def test_a_snapshot_over_the_limit_is_refused_with_its_size(repo):
    (repo / "job" / "weights.bin").write_bytes(os.urandom(64 * 1024))
    _git(repo, "add", "job/weights.bin")
    with pytest.raises(SnapshotError, match=r"^0\.1 MB compressed, over the 0\.0625 MB"):
        snapshot("job", repo, limit=64 * 1024)


def test_a_tracked_file_deleted_from_the_checkout_is_named(repo):
    (repo / "job" / "pkg" / "model.py").unlink()
    with pytest.raises(SnapshotError, match=r"^cannot read pkg/model.py \(No such file"):
        snapshot("job", repo)


# ------------------------------------------------------------------ symbolic links
# Git tracks a link as its target's text (mode 120000). The snapshot keeps it a link with that
# text, so the hash is the same in every checkout and the node unpacks the same tree; a link
# must therefore resolve inside the folder, both here and in the node's unpacked copy, and its
# target must be in the snapshot.


def _link(repo: Path, name: str, target: str) -> None:
    path = repo / "job" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    _git(repo, "add", f"job/{name}")


def test_a_link_inside_the_folder_stays_a_link_that_unpacks_as_one(repo, tmp_path):
    _link(repo, "main.py", "train.py")
    _link(repo, "lib", "pkg")  # a folder of the snapshot
    _link(repo, "pkg/again.py", "../train.py")
    snap = snapshot("job", repo)
    members = _members(snap.data)
    assert (members["main.py"].issym(), members["main.py"].linkname) == (True, "train.py")
    assert (members["lib"].linkname, members["pkg/again.py"].linkname) == ("pkg", "../train.py")
    out = tmp_path / "unpacked"
    with tarfile.open(fileobj=io.BytesIO(snap.data), mode="r:gz") as tar:
        tar.extractall(out, filter="data")  # what the node's unpacking allows
    assert (out / "main.py").read_text() == "print('train')\n"
    assert (out / "lib" / "model.py").read_text() == "X = 1\n"
    assert (out / "pkg" / "again.py").read_text() == "print('train')\n"


@pytest.mark.parametrize(
    ("name", "target", "expected"),
    [
        ("data", "/etc", "its link data points at /etc, outside the folder"),
        ("up.py", "../other.py", "its link up.py points at ../other.py, outside the folder"),
        ("pkg/far", "../../..", "its link pkg/far points at ../../.., outside the folder"),
        # In and out again: fine in this checkout, but the node unpacks into another folder.
        ("back.py", "../job/train.py", "its link back.py points at ../job/train.py, outside"),
    ],
)
def test_a_link_leaving_the_folder_is_refused_in_one_line_with_the_fix(
    repo, name, target, expected
):
    _link(repo, name, target)
    with pytest.raises(SnapshotError) as refused:
        snapshot("job", repo)
    message = str(refused.value)
    assert message.startswith(expected) and "\n" not in message
    assert "replace it by the file it points at, or move that into the folder" in message


def test_a_link_through_another_link_that_leaves_is_refused(repo):
    _link(repo, "out", "..")
    _link(repo, "deep.py", "out/other.py")
    with pytest.raises(SnapshotError, match=r"^its link deep\.py points at out/other\.py, outside"):
        snapshot("job", repo)


def test_an_absolute_link_into_the_folder_is_refused_as_machine_bound(repo):
    _link(repo, "abs.py", str(repo / "job" / "train.py"))
    with pytest.raises(SnapshotError) as refused:
        snapshot("job", repo)
    assert str(refused.value).startswith(f"its link abs.py points at {repo}/job/train.py, an ")
    assert "make it relative (ln -sfr" in str(refused.value)


def test_a_link_to_a_file_the_snapshot_lacks_is_refused(repo):
    (repo / "job" / "notes.txt").write_text("untracked\n")
    _link(repo, "notes", "notes.txt")
    _link(repo, "gone.py", "nowhere.py")
    with pytest.raises(SnapshotError) as refused:
        snapshot("job", repo)
    assert str(refused.value).startswith(
        "its link gone.py points at nowhere.py, which the snapshot does not hold (git tracks "
        "no file there); git add it, or remove the link"
    )


@pytest.mark.parametrize("folder", ["", "  "])
def test_an_empty_folder_name_is_refused_rather_than_taken_as_the_repository(repo, folder):
    with pytest.raises(SnapshotError) as refused:
        snapshot(folder, repo)
    assert str(refused.value).startswith("empty, which would be the whole repository; give")


def test_dot_is_the_whole_repository_by_choice(repo):
    # A plug-in of a top-level package (examples.custom_model) is shipped only this way.
    assert sorted(snapshot(".", repo).file_names) == [
        "job/pkg/model.py",
        "job/requirements.txt",
        "job/run.sh",
        "job/train.py",
        "other.py",
    ]
