"""What the acr builder clones, checked against real git repositories: a bare "remote" and a
clone of it in a temporary folder (no git mocking)."""

import subprocess
from pathlib import Path

import pulumi
import pytest

from dt_commands.mocks import AzureMocks
from dt_commands.plan import evaluate
from infra import image_source as source_module
from infra import stack as stack_module
from infra.image_source import commit_to_build, source_state
from infra.naming import PROJECT
from infra.settings.checks import ConfigError
from tests.support.stacks import stack_values

FILES = {
    "docker/Dockerfile": "FROM scratch\n",
    "docker/requirements.txt": "numpy==2.4.6\n",
    "scripts/build_horovod.sh": "#!/bin/sh\n",
    "pyproject.toml": "[project]\nname = 'x'\n",  # not an image input: edits change no tag
    "README.md": "# x\n",
    "trainer/__init__.py": "",
    "infra/__init__.py": "",
}


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def commit(root: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def clone(tmp_path) -> Path:
    """A clone whose first commit is pushed to its bare origin."""
    remote, work = tmp_path / "remote.git", tmp_path / "work"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    subprocess.run(["git", "clone", "-q", str(remote), str(work)], check=True, capture_output=True)
    git(work, "symbolic-ref", "HEAD", "refs/heads/main")
    commit(work, FILES, "first")
    git(work, "push", "-q", "origin", "main")
    return work


def test_a_pushed_clean_commit_is_built(clone):
    head = git(clone, "rev-parse", "HEAD")
    assert source_state(clone) == source_module.SourceState(commit=head, dirty=False, pushed=True)
    assert commit_to_build(clone, strict=True) == head


def test_a_commit_not_on_the_remote_is_refused_with_one_line(clone):
    head = commit(clone, {"trainer/models/build.py": "x = 1\n"}, "local only")
    with pytest.raises(ConfigError) as refused:
        commit_to_build(clone, strict=True)
    message = str(refused.value)
    assert f"commit {head[:12]} is not on the remote" in message and "git push" in message
    assert "\n" not in message
    git(clone, "push", "-q", "origin", "main")  # once pushed, the same commit is built
    assert commit_to_build(clone, strict=True) == head


def test_a_commit_on_any_remote_branch_counts(clone):
    git(clone, "checkout", "-q", "-b", "feature")
    head = commit(clone, {"trainer/models/build.py": "x = 2\n"}, "on a branch")
    git(clone, "push", "-q", "origin", "feature")
    assert commit_to_build(clone, strict=True) == head


def test_uncommitted_or_untracked_image_inputs_are_refused(clone):
    (clone / "trainer" / "__init__.py").write_text("changed = True\n")
    with pytest.raises(ConfigError, match="uncommitted changes"):
        commit_to_build(clone, strict=True)
    git(clone, "checkout", "--", "trainer/__init__.py")
    (clone / "trainer" / "new_module.py").write_text("")
    with pytest.raises(ConfigError, match="uncommitted changes"):
        commit_to_build(clone, strict=True)


def test_changes_outside_the_image_inputs_build_the_last_input_commit(clone):
    built = git(clone, "rev-parse", "HEAD")
    commit(clone, {"infra/network.py": "# infra only\n"}, "infra change, not pushed")
    (clone / "infra" / "stack.py").write_text("# uncommitted infra change\n")
    # The image is the same as HEAD's, the commit is on the remote: nothing to refuse.
    assert commit_to_build(clone, strict=True) == built


def test_outside_a_deployment_the_same_lines_are_warnings(clone, monkeypatch):
    warnings = []
    monkeypatch.setattr(pulumi.log, "warn", lambda text, *a, **k: warnings.append(text))
    head = commit(clone, {"trainer/models/build.py": "x = 3\n"}, "local only")
    (clone / "trainer" / "loop.py").write_text("# uncommitted\n")
    assert commit_to_build(clone, strict=False) == head
    assert len(warnings) == 2
    assert all("pulumi up will refuse this" in w and "\n" not in w for w in warnings)


def test_a_folder_that_is_not_a_checkout_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="not a git checkout"):
        commit_to_build(tmp_path, strict=False)


def test_pulumi_up_refuses_before_declaring_any_resource(clone, monkeypatch):
    commit(clone, {"trainer/models/build.py": "x = 4\n"}, "local only")
    monkeypatch.setattr(source_module, "REPO", clone)
    monkeypatch.setattr(source_module, "deploying", lambda: True)  # as in a real `pulumi up`

    def too_early(*args, **kwargs):
        raise AssertionError("a resource was declared before the source check")

    monkeypatch.setattr(stack_module.resources, "ResourceGroup", too_early)
    with pytest.raises(ConfigError, match="not on the remote"):
        evaluate("dev", stack_values("dev"))


@pytest.mark.parametrize("preview", [False, True])
def test_mocks_and_previews_are_not_deployments(preview):
    # Under Pulumi's mocks (the offline plan, the tests) and in previews nothing is built.
    pulumi.runtime.set_mocks(AzureMocks(), project=PROJECT, stack="dev", preview=preview)
    assert source_module.deploying() is False
