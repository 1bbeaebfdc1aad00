"""The content tag, read from real git repositories in a temporary folder: it hashes what the
acr builder's task clones (tracked files), never what git ignores or does not know."""

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from infra.image_inputs import IMAGE_INPUTS, REPO, ImageInputsError, content_tag, input_files
from tests.infra.test_image_source import commit, git


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A checkout holding this repository's tracked image inputs and .gitignore, committed."""
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    for name in [".gitignore", *input_files(REPO)]:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, work / name)
    commit(work, {}, "inputs")
    return work


def test_the_tag_of_a_copy_of_the_tracked_inputs_is_this_checkouts(checkout):
    tag = content_tag(checkout)
    assert tag == content_tag(REPO) and len(tag) == 16


def test_ignored_and_untracked_files_under_trainer_keep_the_tag(checkout):
    tag = content_tag(checkout)
    runs = checkout / "trainer" / "runs" / "dev" / "run1"
    runs.mkdir(parents=True)
    (runs / "metrics.jsonl").write_text('{"step": 1}\n')  # ignored (runs/)
    (checkout / "trainer" / "__pycache__").mkdir(exist_ok=True)
    (checkout / "trainer" / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"\0")  # ignored
    (checkout / "trainer" / "scratch.py").write_text("print('not committed')\n")  # untracked
    assert "trainer/runs/" in git(checkout, "status", "--porcelain", "--ignored")
    assert content_tag(checkout) == tag


def test_a_change_to_a_tracked_file_changes_the_tag_committed_or_not(checkout):
    tag = content_tag(checkout)
    with open(checkout / "trainer" / "models" / "build.py", "a") as file:
        file.write("\n# changed\n")
    changed = content_tag(checkout)
    assert changed != tag  # the working tree is what the docker builder sends
    commit(checkout, {}, "change")
    assert content_tag(checkout) == changed
    # Adding a file to git adds it to the image and the tag.
    commit(checkout, {"trainer/extra.py": "X = 1\n"}, "add")
    assert content_tag(checkout) != changed


def test_a_source_archive_has_its_commits_tag_and_counts_every_file_but_bytecode(
    checkout, tmp_path
):
    # Not a checkout (no .git): nothing says what is ignored, so every file counts. An archive
    # of a commit holds exactly its tracked files, so its tag is the commit's.
    archive = subprocess.run(
        ["git", "-C", str(checkout), "archive", "--format=tar", "HEAD"],
        capture_output=True,
        check=True,
    ).stdout
    unpacked = tmp_path / "unpacked"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(unpacked, filter="data")
    tag = content_tag(checkout)
    assert content_tag(unpacked) == tag
    (unpacked / "trainer" / "__pycache__").mkdir(exist_ok=True)
    (unpacked / "trainer" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert content_tag(unpacked) == tag
    (unpacked / "trainer" / "scratch.py").write_text("X = 1\n")
    assert content_tag(unpacked) != tag


def test_a_checkout_git_cannot_read_is_one_line_not_a_silent_other_tag(checkout):
    (checkout / ".git" / "HEAD").write_text("garbage\n")
    with pytest.raises(ImageInputsError) as failed:
        content_tag(checkout)
    assert "\n" not in str(failed.value)
    assert str(failed.value).startswith("content tag: cannot list the tracked image inputs in ")


def test_every_image_input_is_tracked():
    # An input that is not in git would silently drop out of the tag (and of the acr build).
    listed = input_files(REPO)
    for entry in IMAGE_INPUTS:
        assert any(f == entry or f.startswith(entry + "/") for f in listed), entry
