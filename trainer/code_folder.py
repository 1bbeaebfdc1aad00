"""``python -m trainer.code_folder``: a job's code snapshot (``jobs.<name>.code``) made ready on
a node by the job preparation task: downloaded from the ``code`` container with the node's
identity, its SHA-256 verified, unpacked, and its ``requirements.txt`` installed on top of the
image, once per hash (a marker written last), into ``<cache>/<sha256>``; then ``--link`` (in
the job's own folder) points at that folder. The launcher runs the workers in ``<link>/src``
with ``<link>/src`` and ``<link>/site`` on their PYTHONPATH (trainer.launch.workers).

Errors are one line, exit 1: a blob that is not the snapshot the job names, a refused or
missing blob, or pip's own first error line when the requirements do not install.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from trainer.grant_wait import READER, GrantMissing, GrantWait

CONTAINER = "code"  # infra.storage.CONTAINERS: the deployer writes it, nodes only read it
READY = ".ready"  # written last: a folder without it is unfinished and is rebuilt
REQUIREMENTS = "requirements.txt"  # infra.code_snapshot.REQUIREMENTS
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class CodeError(Exception):
    """The snapshot cannot be made ready; a one-line message with the fix."""


def cache_root(env: dict[str, str] | None = None) -> Path:
    """Where snapshots are kept on this node. The node's shared folder gives "read/write
    access to all tasks that run on a node" and outlives jobs (articles/batch/
    files-and-directories.md), so each hash is installed once per node. Inside a container it
    exists only if Batch's ``Shared`` bind mount is the node's folder, which Batch leaves open
    (docs/fake-readings.md): without it, the job preparation task's own folder, which goes
    with the job (installed once per job and node)."""
    env = dict(os.environ) if env is None else env
    shared = env.get("AZ_BATCH_NODE_SHARED_DIR", "")
    if shared and os.path.isdir(shared) and os.access(shared, os.W_OK | os.X_OK):
        return Path(shared) / "code"
    return Path(env["AZ_BATCH_TASK_WORKING_DIR"]) / "code-cache"


def _download(account_url: str, sha256: str, target: Path, wait: GrantWait) -> str:
    """Blob ``<sha256>.tar.gz`` written to ``target``; its SHA-256."""
    from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
    from azure.identity import DefaultAzureCredential
    from azure.storage.blob import ContainerClient

    client = ContainerClient(account_url, CONTAINER, credential=DefaultAzureCredential())
    name = f"{sha256}.tar.gz"
    where = f"{client.url}/{name}"

    def fetch() -> str:
        digest = hashlib.sha256()
        with open(target, "wb") as file:
            for chunk in client.download_blob(name).chunks():
                digest.update(chunk)
                file.write(chunk)
        return digest.hexdigest()

    try:
        return wait.call(fetch, where)
    except GrantMissing as err:
        raise CodeError(str(err)) from None
    except ResourceNotFoundError:
        raise CodeError(
            f"{where}: no such snapshot; run `pulumi up` again (it uploads the job's code)"
        ) from None
    except HttpResponseError as err:
        raise CodeError(f"{where}: {str(err).splitlines()[0]}") from None


def pip_error(stderr: str) -> str:
    """pip's own first error line (``ERROR: ...``), else its first line that says anything."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("ERROR:")), lines[0] if lines else "")


def _install(folder: Path) -> None:
    requirements = folder / "src" / REQUIREMENTS
    if not requirements.is_file():
        return
    pip = [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
    # From the code's own top, as a team runs `pip install -r requirements.txt` there: pip reads
    # a local path in the file (./wheels/x.whl, -e ./lib) from the working folder, not the
    # file's (pypa/pip #8765).
    result = subprocess.run(
        [*pip, "--target", str(folder / "site"), "-r", str(requirements)],
        capture_output=True,
        text=True,
        check=False,
        cwd=folder / "src",
    )
    if result.returncode != 0:
        raise CodeError(
            f"{REQUIREMENTS} of the job's code does not install: "
            f"{pip_error(result.stderr) or f'pip exited with {result.returncode}'}"
        )


def _build(account_url: str, sha256: str, temp: Path, wait: GrantWait) -> tuple[float, float]:
    """Fetches, verifies, unpacks and installs the snapshot in ``temp``; the seconds spent
    fetching (download, hash, unpack) and installing the requirements."""
    started = time.monotonic()
    temp.mkdir(parents=True)
    archive = temp / "snapshot.tar.gz"
    got = _download(account_url, sha256, archive, wait)
    if got != sha256:
        raise CodeError(
            f"code snapshot {sha256[:12]}...: the blob's SHA-256 is {got[:12]}...; run "
            "`pulumi up` again (it uploads the job's code)"
        )
    with tarfile.open(archive, "r:gz") as tar:
        # "data": no absolute names, no links leaving the folder, no device files.
        tar.extractall(temp / "src", filter="data")
    archive.unlink()
    fetched = time.monotonic()
    _install(temp)
    (temp / READY).write_text(sha256 + "\n")
    return fetched - started, time.monotonic() - fetched


def ready(
    account_url: str, sha256: str, root: Path, wait: GrantWait, log: Callable[[str], None] = print
) -> Path:
    """``root/<sha256>``, made ready unless it is already (the marker)."""
    folder = root / sha256
    if (folder / READY).is_file():
        log(f"code {sha256[:12]}: ready on this node already ({folder})")
        return folder
    temp = root / f".{sha256}.{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    try:
        fetch, install = _build(account_url, sha256, temp, wait)
        shutil.rmtree(folder, ignore_errors=True)  # an unfinished one (no marker)
        try:
            os.rename(temp, folder)
        except OSError:
            if not (folder / READY).is_file():
                raise  # another task made it ready meanwhile, or the rename truly failed
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    log(
        f"code {sha256[:12]}: downloaded, verified and installed in {folder} "
        f"(fetch {fetch:.1f} s, install {install:.1f} s)"
    )
    return folder


def link(target: Path, at: Path) -> None:
    """``at`` -> ``target``, replaced atomically."""
    at.parent.mkdir(parents=True, exist_ok=True)
    temp = at.with_name(f".{at.name}.{os.getpid()}")
    temp.unlink(missing_ok=True)
    temp.symlink_to(target)
    os.replace(temp, at)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.code_folder", description=__doc__)
    parser.add_argument("--account-url", required=True, help="the blob endpoint (https://)")
    parser.add_argument("--sha256", required=True, help="the snapshot's SHA-256")
    parser.add_argument("--link", required=True, type=Path, help="made to point at the folder")
    args = parser.parse_args(argv)
    if not SHA256.match(args.sha256):
        parser.error(f"--sha256={args.sha256!r}: give the snapshot's 64 lowercase hex digits")
    wait = GrantWait(READER)
    try:
        root = cache_root()
        root.mkdir(parents=True, exist_ok=True)
        link(ready(args.account_url, args.sha256, root, wait), args.link)
    except CodeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
