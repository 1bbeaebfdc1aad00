"""The operators read what their commands show, with the rights the stack declares for them:
a member of the team's group (jobSubmitterObjectId) signed in with `az login` reads a job's live
metrics from `logs` (dt-jobs metrics, tensorboard, list) and its results from `outputs`
(dt-jobs fetch), against Storage that authorizes like Azure (tests/support/stack_rights.py), and
nothing else: not the datasets, checkpoints or code."""

from __future__ import annotations

import pytest

from infra.live_metrics import StorageError, blob_container, read_metrics
from tests.support.stack_rights import blob_front, sign_in
from tests.support.stacks import CLIENT_IP, stack_values
from tests.support.storage_grants import FIREWALL, MISMATCH, FakeClock
from trainer.common.blob_folder import BlobFolder

MEMBER = "7c2d4e6f-8a9b-4c1d-9e2f-3a4b5c6d7e8f"  # a member of the dev stack's team group
RECORD = b'{"step": 40, "images_per_sec": 812.5}\n'


@pytest.fixture
def team_member(late_grants_on, dev_plan, tmp_path, monkeypatch):
    """The dev stack's Storage, its rights arrived; this process is a team member's laptop.
    The rights are read from the session's ``dev_plan`` (the dev stack file's program under
    mocks, evaluated once for every test that asks; blob_front only reads it)."""
    from infra import credentials

    late = late_grants_on(FakeClock())
    team = stack_values("dev")["gpu-cluster:jobSubmitterObjectId"]
    late.grants.members[team] = {MEMBER}
    blob_front(dev_plan, late.grants, propagation_s=0, caller=CLIENT_IP)
    late.grants.network.ip_rules = (CLIENT_IP,)  # the member's address, as docs/jobs.md asks
    sign_in(monkeypatch, tmp_path / "bin", MEMBER)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(late.storage.ca_file))
    credentials.credential.cache_clear()
    yield late
    credentials.credential.cache_clear()


def _folder(late, container: str) -> BlobFolder:
    return BlobFolder(late.storage.blob_endpoint, container, "runs/dev/job-1/live/")


def _uploaded(late, container: str) -> BlobFolder:
    """A job's live folder in ``container``, holding its metrics (written with the key)."""
    folder = _folder(late, container)
    setup = late.storage.container(container)
    if not setup.exists():
        setup.create_container()
    setup.upload_blob(folder.blob("metrics.jsonl"), RECORD, overwrite=True)
    return folder


@pytest.mark.parametrize("container", ["logs", "outputs"])
def test_a_team_member_reads_what_the_operators_commands_show(team_member, container):
    folder = _uploaded(team_member, container)
    records, _ = read_metrics(blob_container(folder), folder)
    assert records == [{"step": 40, "images_per_sec": 812.5}]


@pytest.mark.parametrize("container", ["datasets", "checkpoints", "code"])
def test_a_team_member_reads_nothing_else(team_member, container):
    folder = _uploaded(team_member, container)
    with pytest.raises(StorageError) as refused:
        read_metrics(blob_container(folder), folder)
    message = str(refused.value)
    assert f"(403 {MISMATCH})" in message and "jobSubmitterObjectId" in message
    assert [who for who, _, _ in team_member.grants.denied] == [MEMBER] * len(
        team_member.grants.denied
    )


def test_a_team_member_outside_the_firewall_is_told_to_add_the_address(team_member):
    team_member.grants.network.caller = "203.0.113.200"
    folder = _folder(team_member, "logs")
    with pytest.raises(StorageError) as refused:
        read_metrics(blob_container(folder), folder)
    message = str(refused.value)
    assert f"(403 {FIREWALL}: the account's firewall refused" in message
    assert "storageAllowedIps" in message and "\n" not in message
