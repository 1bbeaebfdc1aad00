"""A job's code on a node that is not as it should be: the job preparation task's command line
(``python -m trainer.launch.code_folder``) run as a container runs it, with Batch's variables and
the job's identity, and the launcher's ``--code-dir`` as the job's task gives it. Each fault is a
node's, not the user's: one line naming what is missing or unreachable, exit 1, no traceback,
and unreachable storage fails within the bound the module documents."""

from __future__ import annotations

import io
import re
import socket
import sys
import tarfile
import time

import pytest

from infra.batch import job_options, task_options
from infra.job_spec import JobSpec
from tests.infra.test_job_payloads import SPEC
from tests.support.container import REPO, base_path, one_node_pool, run_in_container
from tests.support.fake_imds import IDENTITY
from trainer.launch import code_folder
from trainer.launch.code_folder import CodeError

pytestmark = pytest.mark.processes

SHA = "c0de" * 16


def _spec(blob_endpoint: str) -> JobSpec:
    return JobSpec(
        **{
            **SPEC.__dict__,
            "code_sha256": SHA,
            "blob_endpoint": blob_endpoint,
            "node_identity_client_id": IDENTITY,
            # A size without NVMe disks: the code cache stays in AZ_BATCH_NODE_SHARED_DIR.
            "vm_size": "Standard_ND96asr_v4",
        }
    )


def _node(tmp_path, storage=None) -> tuple[dict[str, str], object]:
    """The preparation task's environment on a node (Batch's variables, the job's own
    settings, the image's PYTHONPATH) and its working folder; ``storage``: the emulator whose
    identity service and certificate the node uses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"  # the image's python
    python.write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    workdir = tmp_path / "wd"
    workdir.mkdir()
    (tmp_path / "shared").mkdir()
    env = {
        "PATH": f"{bin_dir}:{base_path()}",
        "PYTHONPATH": str(REPO),  # the image runs the trainer from PYTHONPATH
        "HOME": str(tmp_path),
        "AZ_BATCH_NODE_SHARED_DIR": str(tmp_path / "shared"),
        "AZ_BATCH_TASK_WORKING_DIR": str(workdir),
        "AZ_BATCH_JOB_ID": SPEC.job_id,
        **(storage.env() if storage is not None else {}),
    }
    return env, workdir


def _prepare(spec: JobSpec, env: dict[str, str], workdir, timeout: float = 120):
    """The job preparation task's command line, with the variables the job gives it."""
    prep = job_options(spec).job_preparation_task
    given = {item.name: item.value for item in prep.environment_settings}
    started = time.monotonic()
    result = run_in_container(prep.command_line, {**env, **given}, workdir, timeout=timeout)
    return result, time.monotonic() - started


def _one_line(result, *parts: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: "), result.stderr
    for part in parts:
        assert part in result.stderr, result.stderr


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once it is closed


@pytest.mark.parametrize("name", ["AZ_BATCH_TASK_WORKING_DIR", "AZURE_CLIENT_ID"])
def test_a_missing_variable_is_named(tmp_path, name):
    env, workdir = _node(tmp_path)
    env.pop("AZ_BATCH_NODE_SHARED_DIR")  # no shared folder: the working folder is the cache
    prep = job_options(_spec("https://visiondata.blob.core.windows.net/")).job_preparation_task
    given = {item.name: item.value for item in prep.environment_settings}
    env = {key: value for key, value in {**env, **given}.items() if key != name}
    # The link is named by the variable: without it, a path under the root.
    command = prep.command_line.replace("${AZ_BATCH_TASK_WORKING_DIR}/code", str(workdir / "l"))
    result = run_in_container(command, env, workdir)
    _one_line(result, f"{name} is not set")


def test_a_working_folder_that_is_not_one_is_named(tmp_path):
    env, workdir = _node(tmp_path)
    env.pop("AZ_BATCH_NODE_SHARED_DIR")
    env["AZ_BATCH_TASK_WORKING_DIR"] = str(tmp_path / "no-such-folder")
    result, _ = _prepare(_spec("https://visiondata.blob.core.windows.net/"), env, workdir)
    _one_line(result, f"AZ_BATCH_TASK_WORKING_DIR={tmp_path}/no-such-folder: no such folder")


def test_a_link_that_cannot_be_made_is_named(tmp_path, azurite_entra):
    env, workdir = _node(tmp_path, azurite_entra)
    (tmp_path / "shared" / "code").write_text("a file where the cache goes\n")
    result, _ = _prepare(_spec(azurite_entra.blob_endpoint), env, workdir)
    _one_line(result, f"{tmp_path}/shared/code: cannot make the node's code cache there")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://visiondata.blob.core.windows.net/", "--account-url=http://visiondata"),
        ("visiondata.blob.core.windows.net", "--account-url=visiondata.blob.core.windows.net"),
    ],
)
def test_a_blob_endpoint_that_is_not_https_is_named(tmp_path, url, expected):
    env, workdir = _node(tmp_path)
    result, _ = _prepare(_spec(url), env, workdir)
    _one_line(result, expected, "give the storage account's https:// blob endpoint")


def test_unreachable_storage_is_named_within_the_documented_bound(tmp_path, azurite_entra):
    env, workdir = _node(tmp_path, azurite_entra)
    url = f"https://127.0.0.1:{_closed_port()}/devstoreaccount1"
    result, took = _prepare(_spec(url), env, workdir, timeout=code_folder.UNREACHABLE_S + 60)
    _one_line(result, f"cannot reach {url}/code/{SHA}.tar.gz", "Connection refused")
    # Every try is refused at once: the SDK's backoffs alone, never the default's 84 s.
    assert took < code_folder.RETRY_BACKOFF_S + 15, took
    assert not list((tmp_path / "shared" / "code").iterdir())  # nothing half-made kept


# ----------------------------------------------------------------- the launcher's --code-dir

WORKER_STUB = """#!/bin/bash
if [ "$1" = train.py ]; then
    echo started >> "$WORKERS_RAN"
fi
exec %s "$@"
"""


@pytest.mark.parametrize("made", ["nothing", "a folder without src"])
def test_a_code_folder_the_preparation_did_not_make_is_named_before_anything_starts(tmp_path, made):
    from tests.trainer.launch.launch_nodes import free_port, held_port

    spec = JobSpec(
        **{
            **SPEC.__dict__,
            "vm_size": "Standard_D2ds_v5",
            "node_count": 1,
            "trainer_args": (),
            "command": ("python", "train.py"),
            "engine": "torch",
            "code_sha256": SHA,
        }
    )
    with held_port() as batch_port:
        env, workdir, ran = one_node_pool(
            tmp_path, WORKER_STUB, spec.job_id, batch_port, free_port(consecutive=2)
        )
        prep = tmp_path / "jobprep"
        prep.mkdir()
        if made != "nothing":
            (prep / "code").mkdir()
        env["AZ_BATCH_JOB_PREP_WORKING_DIR"] = str(prep)
        line = task_options(spec).multi_instance_settings.coordination_command_line
        result = run_in_container(line, env, workdir)
    _one_line(result, f"--code-dir={prep}/code: ", "the job preparation task")
    assert not ran.exists()  # no worker started


# ------------------------------------------------------------------ unpacking


def _archive(path, *members: tuple[str, str]) -> None:
    """A gzipped tar of (name, link target or "" for a file)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, target in members:
            info = tarfile.TarInfo(name)
            if target:
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            else:
                info.size = 3
                tar.addfile(info, io.BytesIO(b"x=1"))


@pytest.mark.parametrize("filtered", [True, False])
@pytest.mark.parametrize(
    "bad", [("out", "../../etc"), ("abs", "/etc/passwd"), ("../up.py", ""), ("/abs.py", "")]
)
def test_unpacking_refuses_what_leaves_the_folder_with_or_without_tarfiles_filter(
    tmp_path, monkeypatch, filtered, bad
):
    if not filtered:  # a Python before 3.11.4 (Debian 12's 3.11.2 too) lacks tarfile's filters
        monkeypatch.delattr(tarfile, "data_filter")
    archive = tmp_path / "snap.tar.gz"
    _archive(archive, ("train.py", ""), bad)
    with pytest.raises(CodeError, match=rf"^code snapshot member {re.escape(bad[0])}: leaves"):
        code_folder.unpack(archive, tmp_path / "src")
    assert not (tmp_path / "src").exists()  # checked before anything is written


def test_unpacking_keeps_links_inside_the_folder_without_tarfiles_filter(tmp_path, monkeypatch):
    monkeypatch.delattr(tarfile, "data_filter")
    archive = tmp_path / "snap.tar.gz"
    _archive(archive, ("pkg/train.py", ""), ("main.py", "pkg/train.py"), ("pkg/me.py", "train.py"))
    code_folder.unpack(archive, tmp_path / "src")
    assert (tmp_path / "src" / "main.py").read_text() == "x=1"
    assert (tmp_path / "src" / "pkg" / "me.py").read_text() == "x=1"
