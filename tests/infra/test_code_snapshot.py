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
    assert snap.files == 4 and snap.has_requirements
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
