"""Staging and uploading a dataset while the identity's role assignment is still propagating:
Storage answers 403 AuthorizationPermissionMismatch until the grant time the test sets
(``late_grants``: tests/support/storage_grants.py). The transfers wait it out, one line per wait, or
fail in one line naming the missing role; never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import act_as_identity_of, checksums
from tests.support.fake_imds import IDENTITY
from tests.support.storage_grants import MISMATCH, FakeClock
from trainer.common.grant_wait import CONTRIBUTOR, READER, GrantWait
from trainer.data.errors import DataError
from trainer.data.manifest import MANIFEST_NAME
from trainer.data.transfer import container_client, stage, upload

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def on_fake_clock(late_grants_on, monkeypatch):
    """Storage behind the grant clock on a fake clock; this process is the node's identity."""
    clock = FakeClock()
    late = late_grants_on(clock)
    act_as_identity_of(late.storage, monkeypatch)
    return late, clock


class Waits:
    """The wait's log lines and sleeps, the sleeps moving the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.lines, self.pauses = clock, [], []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.clock.advance(seconds)

    def grant_wait(self, role: str, minutes: float = 30) -> GrantWait:
        return GrantWait(role, minutes, log=self.lines.append, sleep=self.sleep, clock=self.clock)


def _seeded(late, shards, request) -> str:
    """A container holding the dataset, written with the account key (no RBAC involved)."""
    name = "g" + str(abs(hash(request.node.nodeid)))[:12]
    setup = late.storage.container(name)
    setup.create_container()
    upload(shards, setup, "ds", log=lambda _: None)
    request.addfinalizer(setup.delete_container)
    return name


def test_stage_waits_for_a_late_grant_logging_one_line_per_wait(
    tmp_path, shards, on_fake_clock, request
):
    late, clock = on_fake_clock
    name = _seeded(late, shards, request)
    # Propagated after 2 min; then, for 5 min more, every other request is still refused: the
    # manifest may arrive and a shard still be refused.
    late.grants.grant(IDENTITY, after_s=120, unsettled_s=300)
    waits = Waits(clock)
    client = container_client(late.storage.blob_endpoint, name)
    got = stage(
        client, "ds", tmp_path / "dest", parallel=3, log=lambda _: None,
        grant_wait=waits.grant_wait(READER),
    )  # fmt: skip
    assert checksums(tmp_path / "dest") == checksums(shards)
    assert got.copied == len(list(shards.glob("*.tar")))
    denied_paths = [path for _, _, path in late.grants.denied]
    assert any(".tar" in path for path in denied_paths)  # refused after the manifest came
    assert len(waits.lines) == len(waits.pauses) >= 3
    assert sum(waits.pauses) >= 120
    for line in waits.lines:
        assert "\n" not in line
        assert f"Storage refuses access ({MISMATCH}): identity {IDENTITY} lacks {READER}" in line
        assert "retrying in 60 s" in line


def test_stage_gives_up_after_the_bound_in_one_line_naming_the_role(
    tmp_path, shards, on_fake_clock, request
):
    late, clock = on_fake_clock
    name = _seeded(late, shards, request)
    waits = Waits(clock)
    client = container_client(late.storage.blob_endpoint, name)
    dest = tmp_path / "dest"
    with pytest.raises(DataError) as caught:
        stage(client, "ds", dest, log=lambda _: None, grant_wait=waits.grant_wait(READER))
    message = str(caught.value)
    assert "\n" not in message
    assert f"after 30 min: identity {IDENTITY} lacks {READER} on the storage account" in message
    assert sum(waits.pauses) == pytest.approx(30 * 60)  # the documented propagation time
    assert len(waits.lines) == 30
    assert not dest.exists() or MANIFEST_NAME not in {p.name for p in dest.iterdir()}


def test_upload_waits_for_a_late_contributor_grant(tmp_path, shards, on_fake_clock, request):
    late, clock = on_fake_clock
    name = "u" + str(abs(hash(request.node.nodeid)))[:12]
    setup = late.storage.container(name)
    setup.create_container()
    request.addfinalizer(setup.delete_container)
    late.grants.grant(IDENTITY, after_s=90)
    waits = Waits(clock)
    client = container_client(late.storage.blob_endpoint, name)
    sent = upload(
        shards, client, "ds", log=lambda _: None, grant_wait=waits.grant_wait(CONTRIBUTOR)
    )
    assert sent.copied == len(list(shards.glob("*.tar")))
    assert {b.name for b in setup.list_blobs()} == {
        f"ds/{p.name}" for p in [*shards.glob("*.tar"), shards / MANIFEST_NAME]
    }
    assert len(waits.lines) == 2 and all(CONTRIBUTOR in line for line in waits.lines)


def _cli(late, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
    env["AZURE_IMDS_URL"] = os.environ["AZURE_IMDS_URL"]
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.data", *args],
        cwd=REPO,
        env={**env, **late.storage.env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stage(late, name: str, dest: Path, minutes: str) -> subprocess.Popen[str]:
    endpoint = late.storage.blob_endpoint
    return _cli(late, "stage", "--account-url", endpoint, "--container", name, "--prefix", "ds",
                "--dest", str(dest), "--grant-wait-minutes", minutes)  # fmt: skip


def test_the_stage_command_fails_in_one_line_when_the_role_never_arrives(
    tmp_path, shards, late_grants, request
):
    name = _seeded(late_grants, shards, request)
    process = _stage(late_grants, name, tmp_path / "d", "0.01")
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 2, stderr
    assert "Traceback" not in stderr
    [line] = stderr.splitlines()
    assert line.startswith("error: ")
    assert f"identity {IDENTITY} lacks {READER} on the storage account" in line
    assert f"Storage refuses access ({MISMATCH})" in stdout  # the waits, one line each


def test_the_stage_command_rides_out_a_late_grant(tmp_path, shards, late_grants, request):
    name = _seeded(late_grants, shards, request)
    process = _stage(late_grants, name, tmp_path / "d", "0.5")
    try:
        assert late_grants.grants.refused.wait(120), "the command never asked"
        late_grants.grants.grant(IDENTITY)  # the role reaches Storage once it was refused
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert checksums(tmp_path / "d") == checksums(shards)
    assert f"Storage refuses access ({MISMATCH})" in stdout
