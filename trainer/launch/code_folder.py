"""``python -m trainer.launch.code_folder``: a job's code snapshot (``jobs.<name>.code``) made ready
on a node by the job preparation task: downloaded from the ``code`` container with the node's
identity, its SHA-256 verified, unpacked, and its ``requirements.txt`` installed over the
image's packages (adding packages, never replacing one), once per hash and image package set (a
marker written last), into ``<cache>/<sha256>``; then ``--link`` (in the job's own folder)
points at that folder. The launcher runs the workers in ``<link>/src``
with ``<link>/src`` and ``<link>/site`` on their PYTHONPATH (trainer.launch.workers).

Errors are one line, exit 1 (a node's fault, not the user's): a variable Batch or the job sets
that is missing, a folder that cannot be made, an endpoint that is not https, storage that
cannot be reached (within ``UNREACHABLE_S``), a blob that is not the snapshot the job names, a
refused or missing blob, a requirement that excludes the version of a package the image holds,
or what pip said first when the requirements do not install.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from trainer.common.cli import OneLineParser
from trainer.common.grant_wait import READER, GrantMissing, GrantWait
from trainer.common.requirements import conflicts

if TYPE_CHECKING:
    from trainer.common.azure_sdk import ContainerClient

CONTAINER = "code"  # infra.storage.CONTAINERS: the deployer writes it, nodes only read it
READY = ".ready"  # written last: a folder without it is unfinished and is rebuilt
REQUIREMENTS = "requirements.txt"  # infra.code_snapshot.REQUIREMENTS
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Storage's own retry policy, not a loop of ours (azure-storage-blob ExponentialRetry, read
# 2026-11-28 in the SDK's docs and its _shared/policies.py): retry n waits initial_backoff +
# increment_base**n s, +- the jitter; the defaults (15, 3, 3 retries) wait 18 + 24 + 42 = 84 s
# before a node learns its storage is unreachable, and connect_timeout is 20 s a try.
RETRIES = 3
INITIAL_BACKOFF_S = 2
BACKOFF_BASE_S = 2
JITTER_S = 1
CONNECT_TIMEOUT_S = 10  # a try whose connection is not up by then fails (and is retried)
READ_TIMEOUT_S = 30  # the longest silence within an answer
# The waits between tries, at most (23 s): storage that refuses or cannot be resolved fails
# after this; one that never answers a connect after UNREACHABLE_S (63 s).
RETRY_BACKOFF_S = sum(INITIAL_BACKOFF_S + BACKOFF_BASE_S**n + JITTER_S for n in range(1, 4))
UNREACHABLE_S = RETRY_BACKOFF_S + (RETRIES + 1) * CONNECT_TIMEOUT_S


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
    working = env.get("AZ_BATCH_TASK_WORKING_DIR", "")
    if not working:
        raise CodeError(
            "AZ_BATCH_TASK_WORKING_DIR is not set: Batch sets it for every task; run this as "
            "the job preparation task does"
        )
    if not os.path.isdir(working):
        raise CodeError(
            f"AZ_BATCH_TASK_WORKING_DIR={working}: no such folder; Batch makes it for every "
            "task: run this as the job preparation task does"
        )
    return Path(working) / "code-cache"


def _reason(err: BaseException) -> str:
    """The first line of an SDK error, without urllib3's ``<... object at 0x...>:``."""
    line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return re.sub(r"<[^<>]* object at 0x[0-9a-f]+>: ", "", line)


def _code_container(account_url: str) -> ContainerClient:
    """The code container's client as a node reads it: the pool's identity, retries with
    backoff, bounded connect and read times."""
    from trainer.common.azure_sdk import ContainerClient, DefaultAzureCredential, ExponentialRetry

    # The SDK logs a failed credential chain as a multi-line warning; the error says it once.
    logging.getLogger("azure").setLevel(logging.ERROR)
    return ContainerClient(
        account_url,
        CONTAINER,
        credential=DefaultAzureCredential(),
        retry_policy=ExponentialRetry(
            initial_backoff=INITIAL_BACKOFF_S,
            increment_base=BACKOFF_BASE_S,
            retry_total=RETRIES,
            random_jitter_range=JITTER_S,
        ),
        connection_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
    )


def _download(account_url: str, sha256: str, target: Path, wait: GrantWait) -> str:
    """Blob ``<sha256>.tar.gz`` written to ``target``; its SHA-256."""
    from trainer.common.azure_sdk import (
        AzureError,
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
    )

    client = _code_container(account_url)
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
    except ClientAuthenticationError as err:
        lines = str(err).splitlines()
        said = next((line.strip() for line in lines if "ManagedIdentity" in line), _reason(err))
        raise CodeError(
            f"{where}: the node's identity (AZURE_CLIENT_ID={os.environ.get('AZURE_CLIENT_ID')})"
            f" got no token ({said}); check that the pool holds that identity"
        ) from None
    except HttpResponseError as err:
        raise CodeError(f"{where}: {_reason(err)}") from None
    except AzureError as err:  # no answer: refused, unresolvable, timed out (ServiceRequestError)
        raise CodeError(
            f"cannot reach {where} ({_reason(err)}), after {RETRIES} retries over about "
            f"{RETRY_BACKOFF_S} s: check that the node's subnet reaches the storage account "
            "(its endpoint's DNS name, private endpoint and firewall)"
        ) from None


def image_packages() -> dict[str, str]:
    """What this node's image holds: the packages installed in the environment of the Python
    that runs this (the image's venv), canonical name -> version."""
    paths = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    return {
        canonicalize_name(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions(path=paths)
        if dist.metadata["Name"]
    }


def pinned(have: dict[str, str]) -> str:
    """The image's package set as pip constraints, one ``name==version`` a line."""
    return "".join(f"{name}=={version}\n" for name, version in sorted(have.items()))


def packages_digest(have: dict[str, str]) -> str:
    """Names the image's package set: a folder installed over another set is installed again."""
    return hashlib.sha256(pinned(have).encode()).hexdigest()[:16]


def pip_error(stdout: str, stderr: str) -> str:
    """What pip said went wrong, in one line: for a conflict with the image, the dependency
    that wants another version and the version the image holds (pip prints both on stdout);
    else pip's own first error line (``ERROR: ...``), else its first line that says anything."""
    said = [line.strip() for line in stdout.splitlines()]
    wants = [line for line in said if " depends on " in line]
    held = [line.split("(constraint)", 1)[1].strip() for line in said if "(constraint)" in line]
    if wants and held:
        return f"{wants[0]}, and the image holds {held[0]}"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("ERROR:")), lines[0] if lines else "")


def install_requirements(folder: Path, have: dict[str, str]) -> None:
    """The snapshot's requirements installed over the image: pip sees the image's packages as
    installed (``--prefix``, unlike ``--target``, which installs every dependency again, torch
    included, into a folder that would shadow the image's) and is held to their versions
    (constraints), so it only ever adds packages, into ``packages``; ``site`` links their
    folder, which the launcher puts on PYTHONPATH."""
    requirements = folder / "src" / REQUIREMENTS
    if not requirements.is_file():
        return
    found = conflicts(requirements.read_text(errors="replace"), have)
    if found:  # the deployer refuses the image's pins; this is every package the image holds
        raise CodeError(
            f"{REQUIREMENTS} of the job's code: {found[0]}; accept the image's version or drop "
            "the line (a job's requirements are installed over the image's packages, never in "
            "place of them)"
        )
    constraints = folder / "image-packages.txt"
    constraints.write_text(pinned(have))
    prefix = folder / "packages"
    pip = [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
    # From the code's own top, as a team runs `pip install -r requirements.txt` there: pip reads
    # a local path in the file (./wheels/x.whl, -e ./lib) from the working folder, not the
    # file's (pypa/pip #8765).
    result = subprocess.run(
        [*pip, "--prefix", str(prefix), "-c", str(constraints), "-r", str(requirements)],
        capture_output=True,
        text=True,
        check=False,
        cwd=folder / "src",
    )
    if result.returncode != 0:
        raise CodeError(
            f"{REQUIREMENTS} of the job's code does not install over the image: "
            f"{pip_error(result.stdout, result.stderr) or f'pip exited with {result.returncode}'}"
        )
    # pip's own layout under a prefix: the preferred scheme's library folder (venv's, in the
    # image); pure and platform packages share it on Debian (platlibdir is lib).
    scheme = sysconfig.get_preferred_scheme("prefix")
    paths = sysconfig.get_paths(scheme, vars={"base": str(prefix), "platbase": str(prefix)})
    (folder / "site").symlink_to(Path(paths["purelib"]).relative_to(folder))


def _build(
    account_url: str, sha256: str, temp: Path, wait: GrantWait, have: dict[str, str], marker: str
) -> tuple[float, float]:
    """Fetches, verifies, unpacks and installs the snapshot in ``temp`` over the image's
    packages ``have``, and marks it ready; the seconds spent fetching (download, hash, unpack)
    and installing the requirements."""
    started = time.monotonic()
    temp.mkdir(parents=True)
    archive = temp / "snapshot.tar.gz"
    got = _download(account_url, sha256, archive, wait)
    if got != sha256:
        raise CodeError(
            f"code snapshot {sha256[:12]}...: the blob's SHA-256 is {got[:12]}...; run "
            "`pulumi up` again (it uploads the job's code)"
        )
    unpack(archive, temp / "src")
    archive.unlink()
    fetched = time.monotonic()
    install_requirements(temp, have)
    (temp / READY).write_text(marker)
    return fetched - started, time.monotonic() - fetched


def unpack(archive: Path, into: Path) -> None:
    """Unpacks a snapshot: files, folders and links that stay inside ``into``, as
    infra.code_snapshot makes them, checked here before anything is written. tarfile's "data"
    filter holds to the same where this Python has it: Python added it in 3.11.4 (the image's
    3.13 has it; a 3.11.0 build, as Ubuntu 22.04's, lacks it)."""
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            target = os.path.normpath(os.path.join(os.path.dirname(member.name), member.linkname))
            leaves = os.path.isabs(member.name) or _up(os.path.normpath(member.name))
            if member.issym():
                leaves = leaves or os.path.isabs(member.linkname) or _up(target)
            if leaves or not (member.isfile() or member.isdir() or member.issym()):
                raise CodeError(
                    f"code snapshot member {member.name}: leaves its folder or is no file, "
                    "folder or link; run `pulumi up` again (it uploads the job's code)"
                )
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)


def _up(path: str) -> bool:
    return path == ".." or path.startswith("../")


def ready(
    account_url: str, sha256: str, root: Path, wait: GrantWait, log: Callable[[str], None] = print
) -> Path:
    """``root/<sha256>``, made ready unless it is already (the marker: the snapshot's hash and
    the image's package set it was installed over; another image's set installs it again)."""
    folder = root / sha256
    have = image_packages()
    marker = f"{sha256} {packages_digest(have)}\n"
    if _marked(folder) == marker:
        log(f"code {sha256[:12]}: ready on this node already ({folder})")
        return folder
    temp = root / f".{sha256}.{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    try:
        try:
            fetch, install = _build(account_url, sha256, temp, wait, have, marker)
        except OSError as err:  # the node's disk: full, read-only, a file in the way
            raise CodeError(
                f"{err.filename or temp}: cannot write the job's code on this node "
                f"({err.strerror or err}); free or repair its disk, or keep the node out "
                "(dt-jobs keep-out)"
            ) from None
        shutil.rmtree(folder, ignore_errors=True)  # an unfinished one (no marker)
        try:
            os.rename(temp, folder)
        except OSError:
            if _marked(folder) != marker:
                raise  # another task made it ready meanwhile, or the rename truly failed
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    log(
        f"code {sha256[:12]}: downloaded, verified and installed in {folder} "
        f"(fetch {fetch:.1f} s, install {install:.1f} s)"
    )
    return folder


def _marked(folder: Path) -> str | None:
    try:
        return (folder / READY).read_text()
    except OSError:
        return None


def link(target: Path, at: Path) -> None:
    """``at`` -> ``target``, replaced atomically."""
    at.parent.mkdir(parents=True, exist_ok=True)
    temp = at.with_name(f".{at.name}.{os.getpid()}")
    temp.unlink(missing_ok=True)
    temp.symlink_to(target)
    os.replace(temp, at)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m trainer.launch.code_folder", description=__doc__)
    parser.add_argument("--account-url", required=True, help="the blob endpoint (https://)")
    parser.add_argument("--sha256", required=True, help="the snapshot's SHA-256")
    parser.add_argument("--link", required=True, type=Path, help="made to point at the folder")
    parser.add_argument(
        "--cache-root",
        type=Path,
        default=None,
        help="where snapshots are kept on this node (the job gives the local NVMe array's on "
        "a size that has one: infra.batch.NVME_ROOT); default: cache_root()",
    )
    args = parser.parse_args(argv)
    if not SHA256.match(args.sha256):
        parser.error(f"--sha256={args.sha256!r}: give the snapshot's 64 lowercase hex digits")
    wait = GrantWait(READER)
    try:
        _check_node(args.account_url)
        root = args.cache_root or cache_root()
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CodeError(
                f"{root}: cannot make the node's code cache there ({err.strerror}); free or "
                "repair the node's disk, or keep the node out (dt-jobs keep-out)"
            ) from None
        folder = ready(args.account_url, args.sha256, root, wait)
        try:
            link(folder, args.link)
        except OSError as err:
            raise CodeError(
                f"--link={args.link}: cannot link the code there ({err.strerror})"
            ) from None
    except CodeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def _check_node(account_url: str) -> None:
    """What the job gives the preparation task: an https endpoint (a bearer token never goes
    over plain http: the SDK refuses it) and the node identity's client id."""
    if not account_url.startswith("https://"):
        raise CodeError(
            f"--account-url={account_url}: give the storage account's https:// blob endpoint "
            "(the node sends its token over https alone)"
        )
    if not os.environ.get("AZURE_CLIENT_ID"):
        raise CodeError(
            "AZURE_CLIENT_ID is not set: the job gives its preparation task the client id of "
            "the pool's identity, with which the node reads the code container"
        )


if __name__ == "__main__":
    sys.exit(main())
