"""Shared helpers: small image folders written with Pillow, trainer configs, prepared shard
datasets, and Azurite (the Blob emulator) on 127.0.0.1 for the data and fault tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import torch
from PIL import Image

from tests.support.fake_imds import IDENTITY, FakeImds, serving
from tests.support.ports import free_port
from tests.support.process_tree import RUN_TAG, check_none_left, new_tag
from tests.support.seam_skips import (  # noqa: F401  # hooks
    pytest_runtest_logreport,
    pytest_sessionfinish,
)

# The job's launchers watch the VM's Scheduled Events at the Azure metadata address. Tests run
# those command lines on this machine, which must send nothing beyond loopback: point every
# launcher (subprocesses inherit this) at a closed loopback port, where the watcher gives up at
# once. Tests of the watcher give their own fake metadata service.
os.environ["AZURE_IMDS_URL"] = "http://127.0.0.1:9"
# MLflow 3's telemetry client removes its session variable from os.environ from a thread of its
# own, while requests iterates os.environ for proxies in another request: a CI run met
# KeyError('_MLFLOW_TELEMETRY_SESSION_ID') in a search_runs. Tests send nothing beyond loopback
# anyway; the trainer turns it off too (trainer.outputs.tracking.CLIENT_DEFAULTS).
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"

# No wall-clock limit per Hypothesis example (its default is 200 ms): make test runs these tests
# beside the multi-process runs on the cores those leave idle (scripts/run_tests.sh), where a
# pure function's example may wait longer than that for a core.
hypothesis.settings.register_profile("make-test", deadline=None)
hypothesis.settings.load_profile("make-test")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m processes` (make test's runs, scripts/run_tests.sh) only the test modules that
    mark tests so are imported: no other can hold one, and importing the others (pytest rewrites
    each one's asserts, uncached where PYTHONDONTWRITEBYTECODE is set) is most of a collection's
    11 s before the first run. tests/ci/test_workflows.py checks it collects the same tests."""
    if config.option.markexpr != "processes" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix != ".py" or "mark.processes" in collection_path.read_text():
        return None
    return True


def write_image_folder(root: Path, classes: int = 3, per_class: int = 6, size: int = 40) -> Path:
    generator = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for label in range(classes):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = torch.randint(
                    0, 256, (size, size + 8, 3), generator=generator, dtype=torch.uint8
                )
                image = Image.fromarray(pixels.numpy())
                suffix = ".png" if i % 2 else ".JPEG"
                image.save(folder / f"img{i}{suffix}")
    return root


@pytest.fixture(scope="session")
def uninterrupted_signal_run(tmp_path_factory) -> dict[str, Any]:
    """The final checkpoint of ``SIGNAL_RUN`` run straight through on two Horovod workers, and
    at full speed: what every interrupted and resumed run of it, paced, must end with (run once
    per session; neither the pace of the batches nor saving checkpoints more or less often
    changes anything a run computes)."""
    # A session fixture, so the worker-fault and signal tests of every folder share one run.
    from tests.support.launchers import REPO, SIGNAL_RUN, horovodrun, small_config
    from trainer.checkpoints import single_file
    from trainer.settings.flags import to_flags

    output = tmp_path_factory.mktemp("uninterrupted") / "out"
    command = horovodrun("-m", "trainer", *to_flags(small_config(output, **SIGNAL_RUN)))
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = single_file.load_latest(output / "checkpoints")
    assert found is not None
    return found[1]


@pytest.fixture
def no_leftover_processes(monkeypatch) -> Iterator[str]:
    """Tag every process this test starts; once it ended, none may be alive (every module that
    starts real multi-process runs of the trainer or the launcher uses it for each of its tests:
    tests/support/process_tree.py). Yields the tag."""
    tag = new_tag()
    monkeypatch.setenv(RUN_TAG, tag)
    yield tag
    check_none_left(tag)


@pytest.fixture
def repo() -> Path:
    """The checkout's root (what the runs' subprocesses start in)."""
    return Path(__file__).resolve().parents[1]


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return write_image_folder(tmp_path / "images")


def tiny_config(output_dir: Path, **extra) -> dict:
    """Settings for a tiny, fast synthetic run (the tiny CNN at 16 px)."""
    values = dict(
        model="tiny",
        num_classes=5,
        image_size=16,
        batch_size=8,
        synthetic_size=64,
        synthetic_pool=32,
        epochs=3,
        warmup_epochs=1,
        lr=0.05,
        log_every=3,
        output_dir=str(output_dir),
    )
    return {**values, **extra}


AZURITE = Path(__file__).resolve().parents[1] / ".venv/azurite/node_modules/.bin/azurite-blob"
# Azurite's fixed development account and key, published in its documentation; they only
# open the local emulator, never a real storage account.
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _start_azurite(location: Path, *options: str) -> tuple[subprocess.Popen[bytes], int]:
    """Azurite's Blob service on a free loopback port, once it accepts connections."""
    assert AZURITE.exists(), f"{AZURITE} is missing: run `make setup`"
    port = free_port()
    process = subprocess.Popen(
        [
            str(AZURITE),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(location),
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            *options,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, port
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"azurite did not start on 127.0.0.1:{port}")
            time.sleep(0.2)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory) -> str:
    """A connection string to a fresh Azurite Blob service for this test session."""
    process, port = _start_azurite(tmp_path_factory.mktemp("azurite"))
    yield (
        f"DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{DEV_ACCOUNT};"
    )
    process.kill()  # its data is a temp folder: nothing to flush
    process.wait(timeout=30)


@dataclass(frozen=True)
class EntraStorage:
    """Azurite as a storage account reached the way the trainer and the operator CLI reach one:
    HTTPS, bearer tokens from ``DefaultAzureCredential`` (here the managed identity of a fake
    metadata service, as on a node), no keys."""

    blob_endpoint: str  # https://127.0.0.1:<port>/devstoreaccount1
    ca_file: Path
    imds: FakeImds

    def env(self) -> dict[str, str]:
        """What a process needs to find the identity and trust the emulator's certificate."""
        return {
            "AZURE_POD_IDENTITY_AUTHORITY_HOST": self.imds.url,
            "AZURE_CLIENT_ID": IDENTITY,
            "REQUESTS_CA_BUNDLE": str(self.ca_file),
        }

    def folder_url(self, container: str, prefix: str) -> str:
        return f"{self.blob_endpoint}/{container}/{prefix}"

    def container(self, name: str):
        """A key-authenticated client for the test's own setup and checks."""
        from azure.storage.blob import ContainerClient

        connection = (
            f"DefaultEndpointsProtocol=https;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};"
            f"BlobEndpoint={self.blob_endpoint};"
        )
        return ContainerClient.from_connection_string(
            connection, name, connection_verify=str(self.ca_file)
        )


@pytest.fixture(scope="session")
def azurite_entra(tmp_path_factory) -> Iterator[EntraStorage]:
    """Azurite over HTTPS with ``--oauth basic`` and a fake metadata service issuing the
    managed identity's tokens, for this test session."""
    from tests.support.tls import self_signed

    folder = tmp_path_factory.mktemp("azurite-entra")
    cert, key = self_signed(folder / "tls", name="azurite")
    process, port = _start_azurite(
        folder / "data", "--oauth", "basic", "--cert", str(cert), "--key", str(key)
    )
    try:
        with serving() as imds:
            yield EntraStorage(f"https://127.0.0.1:{port}/{DEV_ACCOUNT}", cert, imds)
    finally:
        process.kill()
        process.wait(timeout=30)


@pytest.fixture
def logs(azurite_entra, request):
    """An empty container on the emulator (what the stack's ``logs`` container is)."""
    client = azurite_entra.container("l" + str(abs(hash(request.node.nodeid)))[:12])
    client.create_container()
    yield client
    client.delete_container()


def act_as_identity_of(storage: EntraStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process authenticates to ``storage`` with DefaultAzureCredential, as its managed
    identity: only ``storage``'s AZURE_* variables (AZURE_IMDS_URL stays closed)."""
    for name in [n for n in os.environ if n.startswith("AZURE_") and n != "AZURE_IMDS_URL"]:
        monkeypatch.delenv(name)
    for name, value in storage.env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def entra_env(azurite_entra, monkeypatch) -> EntraStorage:
    """This process authenticates to ``azurite_entra`` with DefaultAzureCredential."""
    from infra import credentials

    act_as_identity_of(azurite_entra, monkeypatch)
    credentials.credential.cache_clear()  # built afresh from this environment
    yield azurite_entra
    credentials.credential.cache_clear()


@pytest.fixture
def container(azurite, request):
    from azure.storage.blob import ContainerClient

    name = "t" + str(abs(hash(request.node.nodeid)))[:12]
    client = ContainerClient.from_connection_string(azurite, name)
    client.create_container()
    yield client
    client.delete_container()


def checksums(folder: Path) -> dict[str, str]:
    """SHA-256 of every file in ``folder`` (hidden temp files included), by name."""
    from trainer.common.files import sha256_file

    return {p.name: sha256_file(p) for p in sorted(folder.iterdir())}


def make_dataset(root: Path, classes: int = 3, per_class: int = 12, size: int = 48) -> Path:
    return write_image_folder(root, classes=classes, per_class=per_class, size=size)


@pytest.fixture
def dataset(tmp_path) -> Path:
    return make_dataset(tmp_path / "src")


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prepared")
    out = root / "shards"
    from trainer.data.prepare import prepare

    prepare(make_dataset(root / "src"), out, shard_mb=0.03, processes=2, log=lambda _: None)
    return out


@pytest.fixture
def shards(tmp_path, prepared) -> Path:
    """The generated dataset (``dataset``) prepared into small shards, several per split: a
    private copy of one session-wide preparation, so tests may damage it. Only the dataset is
    copied: not the record of verified shards that runs on the session's copy leave beside it."""
    from trainer.data.manifest import VERIFIED_NAME

    ignore = shutil.ignore_patterns(VERIFIED_NAME)
    return Path(shutil.copytree(prepared, tmp_path / "shards", ignore=ignore))


@dataclass(frozen=True)
class LateGrants:
    """``azurite_entra`` behind the grant clock (tests/support/storage_grants.py): ``storage`` is
    reached like ``azurite_entra`` (its ``env()`` for subprocesses, ``container()`` for key-signed
    setup, which the grants never refuse); ``grants`` says when each identity's role has
    propagated."""

    storage: EntraStorage
    grants: Any  # tests.support.storage_grants.Grants


@pytest.fixture
def late_grants(azurite_entra, tmp_path) -> Iterator[LateGrants]:
    """Storage that refuses the managed identity (403 AuthorizationPermissionMismatch) until
    ``grants.grant(IDENTITY, ...)``; the real clock (``late_grants_on`` takes another)."""
    with _late_grants(azurite_entra, tmp_path, time.monotonic) as late:
        yield late


@pytest.fixture
def late_grants_on(azurite_entra, tmp_path):
    """``late_grants`` on a clock the test gives (tests.support.storage_grants.FakeClock)."""
    with contextlib.ExitStack() as stack:
        yield lambda clock: stack.enter_context(_late_grants(azurite_entra, tmp_path, clock))


@contextlib.contextmanager
def _late_grants(entra: EntraStorage, tmp_path: Path, clock) -> Iterator[LateGrants]:
    from tests.support.storage_grants import Grants, grant_proxy

    grants = Grants(clock=clock)
    upstream = entra.blob_endpoint.removesuffix(f"/{DEV_ACCOUNT}")
    with grant_proxy(upstream, entra.ca_file, grants, tmp_path / "grants-tls") as (url, cert):
        yield LateGrants(EntraStorage(f"{url}/{DEV_ACCOUNT}", cert, entra.imds), grants)
