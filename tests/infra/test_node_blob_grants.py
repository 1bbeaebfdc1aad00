"""The nodes' Blob roles as the program declares them (the dev stack's plan), given to the
storage fake (tests/support/storage_grants.py: per container, per role) and exercised by the
trainer's own clients with the node's identity: the code snapshot downloads, a write to the
``code`` container is refused with 403, rank 0 still writes its logs and results."""

from __future__ import annotations

import pytest
from azure.core.exceptions import HttpResponseError

from infra.code_snapshot import snapshot
from infra.identity import STORAGE_BLOB_DATA_CONTRIBUTOR, STORAGE_BLOB_DATA_READER
from tests.conftest import act_as_identity_of
from tests.infra.test_job_code_node import _team_repo
from tests.support.fake_imds import IDENTITY
from tests.support.stacks import of_type
from tests.support.storage_grants import CONTRIBUTOR, MISMATCH, READER
from trainer.common.blob_client import container_client
from trainer.common.blob_folder import BlobFolder
from trainer.common.grant_wait import READER as WAIT_READER
from trainer.common.grant_wait import GrantWait
from trainer.launch.code_folder import ready

ROLES = {STORAGE_BLOB_DATA_READER: READER, STORAGE_BLOB_DATA_CONTRIBUTOR: CONTRIBUTOR}
CONTAINER_SCOPE = "/blobServices/default/containers/"


def node_grants(plan) -> list[tuple[str, str | None]]:
    """(role, container or None for the account) of each Blob role the plan gives the nodes."""
    grants = []
    for assignment in of_type(plan, "azure-native:authorization:RoleAssignment"):
        role = assignment.inputs["roleDefinitionId"].rsplit("/", 1)[-1]
        if "-nodes-" not in assignment.name or role not in ROLES:
            continue
        _, _, container = assignment.inputs["scope"].partition(CONTAINER_SCOPE)
        grants.append((ROLES[role], container or None))
    return grants


@pytest.fixture
def node_storage(late_grants, dev_plan, monkeypatch):
    """The fake account with the plan's node grants in force, this process as the node."""
    for name in ("code", "logs", "outputs"):
        client = late_grants.storage.container(name)
        if not client.exists():
            client.create_container()
    grants = node_grants(dev_plan)
    assert grants, "the plan gives the nodes no Blob role"
    for role, container in grants:
        late_grants.grants.grant(IDENTITY, role=role, container=container)
    act_as_identity_of(late_grants.storage, monkeypatch)
    return late_grants


def test_the_node_downloads_a_snapshot_and_may_not_write_the_code_container(tmp_path, node_storage):
    storage = node_storage.storage
    snap = _team_repo(tmp_path, None)
    storage.container("code").upload_blob(snap.blob_name, snap.data, overwrite=True)
    wait = GrantWait(WAIT_READER, minutes=0)
    folder = ready(storage.blob_endpoint, snap.sha256, tmp_path / "shared", wait, print)
    assert (folder / "src" / "train.py").read_text() == "print('team code')\n"
    code = container_client(BlobFolder.parse(storage.folder_url("code", "")))
    with pytest.raises(HttpResponseError) as refused:
        code.upload_blob(snapshot("team", tmp_path / "repo").blob_name, b"x", overwrite=True)
    assert refused.value.status_code == 403 and MISMATCH in str(refused.value)
    with pytest.raises(HttpResponseError) as refused:
        code.delete_blob(snap.blob_name)
    assert refused.value.status_code == 403
    assert storage.container("code").get_blob_client(snap.blob_name).exists()


def test_the_node_still_writes_its_logs_and_results(node_storage):
    storage = node_storage.storage
    for name in ("logs", "outputs"):
        client = container_client(BlobFolder.parse(storage.folder_url(name, "job-1/")))
        client.upload_blob("job-1/probe.txt", b"written by the node", overwrite=True)
        client.delete_blob("job-1/probe.txt")  # trainer.outputs.results deletes a stale manifest
    assert not node_storage.grants.denied


def test_nothing_asks_batch_auto_storage_for_blobs_the_nodes_have_no_grant_for(dev_plan):
    """Nodes use Batch auto-storage for application packages and resource files from an
    auto-storage container (infra.identity.Identities); the grants above hold while the program
    declares neither: no Batch application, no resource file in the pool's start task, the job
    preparation task or the training task."""
    from infra.batch import job_options, task_options
    from tests.infra.test_job_payloads import SPEC

    assert not [r for r in dev_plan.resources if r.typ.startswith("azure-native:batch:Applic")]
    for pool in of_type(dev_plan, "azure-native:batch:Pool"):
        assert not pool.inputs.get("applicationPackages"), pool.name
        assert not pool.inputs.get("startTask", {}).get("resourceFiles"), pool.name
    spec = SPEC.__class__(**{**SPEC.__dict__, "code_sha256": "c0de" * 16, "dataset_prefix": "x"})
    prep = job_options(spec).job_preparation_task
    task = task_options(spec)
    assert prep is not None and not prep.resource_files
    assert not task.resource_files and not task.application_package_references
    assert task.multi_instance_settings is not None
    assert not task.multi_instance_settings.common_resource_files
