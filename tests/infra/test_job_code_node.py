"""A job's code on the node: the job preparation task's command line run as a container runs
it (bash, Batch's variables, a stub ``python`` recording what ran), and
``trainer.launch.code_folder`` for real against Azurite with the node's identity (Entra tokens, no
keys): the snapshot downloaded, verified, unpacked and its requirements installed once per hash,
pip's own first error line when they do not install; the launcher running the workers in the
snapshot."""

from __future__ import annotations

import subprocess
import sys

import pytest

from infra.batch import NVME_ROOT, has_nvme, job_options, task_options
from infra.code_snapshot import snapshot
from infra.job_spec import JobSpec
from tests.infra.test_job_payloads import SPEC, node  # noqa: F401 (its fixture)
from tests.support.container import recorded, run_in_container
from tests.support.wheels import write_wheel
from trainer.common.grant_wait import READER, GrantWait
from trainer.launch import code_folder
from trainer.launch.code_folder import CodeError, image_packages, packages_digest, ready

SHA = "c0de" * 16


def _spec(**changes) -> JobSpec:
    return JobSpec(**{**SPEC.__dict__, **changes})


def test_a_job_with_code_prepares_it_first_then_stages_and_mounts_the_shared_folder(node):  # noqa: F811
    env, workdir, record, _ = node
    prep = job_options(_spec(code_sha256=SHA, dataset_prefix="imagenet")).job_preparation_task
    assert prep is not None and prep.wait_for_success is True and prep.id == "stage-data"
    mounts = [b.source for b in prep.container_settings.container_host_batch_bind_mounts]
    assert mounts == ["Task", "VfsMounts", "JobPrep", "Shared"]
    result = run_in_container(prep.command_line, env, workdir)
    assert result.returncode == 0, result.stderr
    code, stage = recorded(record)
    assert code == [
        "-m",
        "trainer.launch.code_folder",
        "--account-url",
        SPEC.blob_endpoint,
        "--sha256",
        SHA,
        "--link",
        f"{workdir}/code",  # the preparation's AZ_BATCH_TASK_WORKING_DIR
        "--cache-root",  # the size's NVMe array holds the node's code cache
        f"{NVME_ROOT}/code",
    ]
    assert has_nvme(SPEC.vm_size), SPEC.vm_size
    assert stage[:3] == ["-m", "trainer.data", "stage"]
    only_code = job_options(_spec(code_sha256=SHA)).job_preparation_task
    assert only_code is not None and only_code.id == "prepare-code"
    assert job_options(SPEC).job_preparation_task is None  # no code, no dataset: none
    plain = _spec(dataset_prefix="imagenet")
    mounts = job_options(plain).job_preparation_task.container_settings
    assert [b.source for b in mounts.container_host_batch_bind_mounts][-1] == "JobPrep"


def test_a_failed_code_step_fails_the_preparation_before_staging(node):  # noqa: F811
    env, workdir, record, tmp_path = node
    failing = tmp_path / "bin" / "python"
    failing.write_text(f'#!/bin/bash\necho "$*" >> {record}\nexit 1\n')
    prep = job_options(_spec(code_sha256=SHA, dataset_prefix="imagenet")).job_preparation_task
    result = run_in_container(prep.command_line, env, workdir)
    assert result.returncode == 1
    (only,) = record.read_text().splitlines()
    assert only.startswith("-m trainer.launch.code_folder ")


def test_the_launcher_is_told_the_code_folder_of_the_job_prep_mount(node):  # noqa: F811
    env, workdir, record, _ = node
    env["AZ_BATCH_JOB_PREP_WORKING_DIR"] = str(workdir)
    task = task_options(_spec(code_sha256=SHA))
    for line in (task.multi_instance_settings.coordination_command_line, task.command_line):
        result = run_in_container(line, env, workdir)
        assert result.returncode == 0, result.stderr
        (argv,) = recorded(record)
        record.unlink()
        assert argv[argv.index("--code-dir") + 1] == f"{workdir}/code"
        assert argv.index("--code-dir") < argv.index("--")


# ------------------------------------------------------------ trainer.launch.code_folder on Azurite


def _team_repo(tmp_path, requirements: str | None):
    repo = tmp_path / "repo"
    (repo / "team" / "pkg").mkdir(parents=True)
    (repo / "team" / "train.py").write_text("print('team code')\n")
    (repo / "team" / "pkg" / "__init__.py").write_text("VALUE = 7\n")
    write_wheel(repo / "team" / "wheels", "team_dep", "VALUE = 3\n")
    if requirements is not None:
        (repo / "team" / "requirements.txt").write_text(requirements)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "team"], check=True)
    return snapshot("team", repo)


@pytest.fixture
def code(azurite_entra, entra_env):
    client = azurite_entra.container("code")
    if not client.exists():
        client.create_container()
    return client


def _wait() -> GrantWait:
    return GrantWait(READER, minutes=0)


def test_a_snapshot_is_downloaded_verified_and_installed_once_per_hash(
    tmp_path, code, azurite_entra, monkeypatch
):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing to fetch; pip runs for real
    # A wheel of the team's own, named relative to the code's top as the team installs it.
    snap = _team_repo(tmp_path, "./wheels/team_dep-0.1-py3-none-any.whl\n")
    code.upload_blob(snap.blob_name, snap.data, overwrite=True)
    root, said = tmp_path / "node-shared" / "code", []
    folder = ready(azurite_entra.blob_endpoint, snap.sha256, root, _wait(), said.append)
    assert folder == root / snap.sha256
    assert (folder / "src" / "train.py").read_text() == "print('team code')\n"
    assert (folder / "src" / "pkg" / "__init__.py").is_file()
    assert (folder / "site" / "team_dep" / "__init__.py").read_text() == "VALUE = 3\n"
    image = packages_digest(image_packages())
    assert (folder / ".ready").read_text() == f"{snap.sha256} {image}\n"
    assert sorted(p.name for p in root.iterdir()) == [snap.sha256]  # no temp folder left
    # Cached on the node: the next job with this hash downloads and installs nothing.
    code.delete_blob(snap.blob_name)
    assert ready(azurite_entra.blob_endpoint, snap.sha256, root, _wait(), said.append) == folder
    assert "ready on this node already" in said[-1]


def test_a_blob_that_is_not_the_snapshot_is_refused(tmp_path, code, azurite_entra):
    snap = _team_repo(tmp_path, None)
    code.upload_blob(snap.blob_name, snap.data + b"tampered", overwrite=True)
    root = tmp_path / "shared" / "code"
    with pytest.raises(CodeError, match=r"the blob's SHA-256 is .*run `pulumi up` again"):
        ready(azurite_entra.blob_endpoint, snap.sha256, root, _wait())
    assert not (root / snap.sha256).exists()
    assert not list(root.iterdir())


def test_requirements_that_do_not_install_fail_with_pips_first_error_line(
    tmp_path, code, azurite_entra, monkeypatch
):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    snap = _team_repo(tmp_path, "no-such-package-dt==1.0\n")
    code.upload_blob(snap.blob_name, snap.data, overwrite=True)
    root = tmp_path / "shared" / "code"
    with pytest.raises(CodeError) as failed:
        ready(azurite_entra.blob_endpoint, snap.sha256, root, _wait())
    message = str(failed.value)
    assert message.startswith(
        "requirements.txt of the job's code does not install over the image: ERROR: Could not "
        "find a version "
        "that satisfies the requirement no-such-package-dt==1.0"
    )
    assert "\n" not in message
    assert not list(root.iterdir())  # nothing half-ready is kept


def _with_wheels(tmp_path, requirements: str, *wheels: tuple[str, tuple[str, ...]]):
    """A team repository whose requirements.txt installs its own wheels, each depending on
    what it names."""
    snap_repo = tmp_path / "repo"
    for name, requires in wheels:
        write_wheel(snap_repo / "team" / "wheels", name, "VALUE = 1\n", requires)
    return _team_repo(tmp_path, requirements)


def test_a_requirement_on_an_image_package_adds_only_what_the_image_lacks(
    tmp_path, code, azurite_entra, monkeypatch
):
    """pip --target installed every dependency again into the job's site, which comes first on
    PYTHONPATH: a team package needing numpy (or torch) brought another copy that shadowed the
    image's, after each node downloaded it. Over the image, pip sees numpy installed."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing to fetch: the image's numpy must do
    have = image_packages()
    snap = _with_wheels(
        tmp_path,
        "./wheels/team_stats-0.1-py3-none-any.whl\n",
        ("team_stats", (f"numpy>={have['numpy']}",)),
    )
    code.upload_blob(snap.blob_name, snap.data, overwrite=True)
    folder = ready(azurite_entra.blob_endpoint, snap.sha256, tmp_path / "code", _wait())
    site = folder / "site"
    assert sorted(p.name.split("-")[0] for p in site.iterdir()) == ["team_stats", "team_stats"]
    added = subprocess.run(
        [sys.executable, "-c", "import numpy, team_stats; print(numpy.__file__)"],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert not added.stdout.startswith(str(tmp_path)), added.stdout  # the image's numpy


def test_a_dependency_that_excludes_an_image_package_is_one_line_naming_both_versions(
    tmp_path, code, azurite_entra, monkeypatch
):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    numpy = image_packages()["numpy"]
    snap = _with_wheels(
        tmp_path, "./wheels/team_old-0.1-py3-none-any.whl\n", ("team_old", ("numpy<2",))
    )
    code.upload_blob(snap.blob_name, snap.data, overwrite=True)
    root = tmp_path / "shared" / "code"
    with pytest.raises(CodeError) as failed:
        ready(azurite_entra.blob_endpoint, snap.sha256, root, _wait())
    assert str(failed.value) == (
        "requirements.txt of the job's code does not install over the image: team-old 0.1 "
        f"depends on numpy<2, and the image holds numpy=={numpy}"
    )
    assert not list(root.iterdir())


def test_a_line_that_excludes_an_image_package_is_refused_before_pip_runs(
    tmp_path, code, azurite_entra, monkeypatch
):
    # An index nothing answers: had pip run, it would have said so instead.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    numpy = image_packages()["numpy"]
    snap = _team_repo(tmp_path, "requests\nnumpy<2\n")
    code.upload_blob(snap.blob_name, snap.data, overwrite=True)
    with pytest.raises(CodeError) as failed:
        ready(azurite_entra.blob_endpoint, snap.sha256, tmp_path / "code", _wait())
    assert str(failed.value).startswith(
        f"requirements.txt of the job's code: line 2 `numpy<2` excludes the image's numpy {numpy}; "
        "accept the image's version or drop the line"
    )


def test_a_folder_installed_over_another_images_packages_is_installed_again(
    tmp_path, code, azurite_entra, monkeypatch
):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    snap = _team_repo(tmp_path, "./wheels/team_dep-0.1-py3-none-any.whl\n")
    code.upload_blob(snap.blob_name, snap.data, overwrite=True)
    root, said = tmp_path / "code", []
    folder = ready(azurite_entra.blob_endpoint, snap.sha256, root, _wait(), said.append)
    (folder / ".ready").write_text(f"{snap.sha256} {'0' * 16}\n")  # a former image's set
    assert ready(azurite_entra.blob_endpoint, snap.sha256, root, _wait(), said.append) == folder
    assert "downloaded, verified and installed" in said[-1]
    assert (folder / ".ready").read_text().split() == [
        snap.sha256,
        packages_digest(image_packages()),
    ]
    assert sorted(p.name for p in root.iterdir()) == [snap.sha256]


def test_the_command_links_the_folder_and_prints_one_line_on_failure(
    tmp_path, code, azurite_entra, monkeypatch
):
    snap = _team_repo(tmp_path, None)
    code.upload_blob(snap.blob_name, snap.data, overwrite=True)
    (tmp_path / "wd").mkdir()  # Batch makes each task's working folder
    monkeypatch.setenv("AZ_BATCH_TASK_WORKING_DIR", str(tmp_path / "wd"))
    monkeypatch.delenv("AZ_BATCH_NODE_SHARED_DIR", raising=False)  # the container lacks it
    args = ["--account-url", azurite_entra.blob_endpoint, "--sha256", snap.sha256]
    assert code_folder.main([*args, "--link", str(tmp_path / "wd" / "code")]) == 0
    assert (tmp_path / "wd" / "code" / "src" / "train.py").is_file()
    assert (tmp_path / "wd" / "code").resolve() == tmp_path / "wd" / "code-cache" / snap.sha256
    shared = tmp_path / "node-shared"
    shared.mkdir()
    monkeypatch.setenv("AZ_BATCH_NODE_SHARED_DIR", str(shared))
    assert code_folder.cache_root() == shared / "code"
    missing = ["--account-url", azurite_entra.blob_endpoint, "--sha256", "0" * 64]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.launch.code_folder",
            *missing,
            "--link",
            str(tmp_path / "l"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "no such snapshot" in result.stderr


WORKER_STUB = """#!/bin/bash
if [ "$1" = train.py ]; then
    echo "cwd=$PWD PYTHONPATH=$PYTHONPATH" >> "$WORKERS_RAN"
    exit 0
fi
exec %s "$@"
"""


def test_the_workers_run_in_the_snapshot_with_it_and_its_site_first_on_pythonpath(tmp_path):
    from tests.support.container import one_node_pool
    from tests.trainer.launch.launch_nodes import free_port, held_port

    spec = _spec(
        vm_size="Standard_D2ds_v5",
        node_count=1,
        trainer_args=(),
        command=("python", "train.py"),
        engine="torch",
        code_sha256=SHA,
    )
    task = task_options(spec)
    with held_port() as batch_port:
        env, workdir, ran = one_node_pool(
            tmp_path, WORKER_STUB, spec.job_id, batch_port, free_port(consecutive=2)
        )
        prep = tmp_path / "jobprep"
        (prep / "code" / "src").mkdir(parents=True)
        env["AZ_BATCH_JOB_PREP_WORKING_DIR"] = str(prep)
        result = run_in_container(
            task.multi_instance_settings.coordination_command_line, env, workdir
        )
    assert result.returncode == 0, result.stdout + result.stderr
    (worker,) = ran.read_text().splitlines()
    code = f"{prep}/code"
    assert worker == f"cwd={code}/src PYTHONPATH={code}/src:{code}/site:{env['PYTHONPATH']}"
