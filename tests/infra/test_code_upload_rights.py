"""A ``code:`` job deployed against Storage that authorizes like Azure (tests/support/
stack_rights.py): the deployer holds only what the stack declares and docs/deploy.md lists as
prerequisites, the account's firewall admits only its IP rules and subnets, and a new role
assignment arrives late. The documented example (``jobs.mine.code: examples/torchrun_ddp``):
planned, uploaded from a laptop whose address the stack admits, fetched by the nodes; a CI
runner outside the rules and a stack that admits no address are refused in one line."""

from __future__ import annotations

import json

import pytest

from dt_commands.mocks import DEPLOYER_OBJECT_ID
from dt_commands.plan import evaluate
from infra.code_snapshot import snapshot
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from infra.settings.values import load_schema
from tests.support.fake_imds import IDENTITY
from tests.support.stack_rights import blob_front, sign_in
from tests.support.stacks import CLIENT_IP, REPO, stack_values
from tests.support.storage_grants import FIREWALL, SUBNET, FakeClock

MINE = {"command": "python train.py --steps 40", "code": "examples/torchrun_ddp", "nodes": 1}
NODES = "principal-platform-dev-nodes"  # the mocks' principal id of the nodes' identity
PROPAGATION_S = 600.0  # a seeded delay inside Azure's documented "up to 30 minutes"


def _values(allowed_ips: list[str]) -> dict:
    return {
        **stack_values("dev"),
        "gpu-cluster:jobs": json.dumps({"mine": MINE}),
        "gpu-cluster:storageAllowedIps": json.dumps(allowed_ips),
    }


@pytest.fixture(scope="module")
def code_stack_plan():
    """The documented code job's stack, admitting ``CLIENT_IP``, evaluated under mocks once for
    this module: the stack both deploy tests (through ``stack_storage``) and the non-preview
    case of the grant test read (blob_front and the asserts only read it)."""
    return evaluate("dev", _values([CLIENT_IP]))


@pytest.fixture
def laptop(tmp_path, monkeypatch):
    """This process deploys from a laptop signed in with `az login` as the deployer."""
    from infra import credentials

    sign_in(monkeypatch, tmp_path / "bin")
    credentials.credential.cache_clear()
    yield
    credentials.credential.cache_clear()


@pytest.fixture
def stack_storage(late_grants_on, laptop, code_stack_plan, monkeypatch):
    """The planned stack's Storage (``code_stack_plan``): its declared rights, late, behind its
    firewall; the upload's wait on a fake clock. Call it with the address requests come from."""
    from infra import code_upload
    from trainer.common.grant_wait import GrantWait

    clock = FakeClock()
    late = late_grants_on(clock)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(late.storage.ca_file))
    waits: list[str] = []

    def grant_wait() -> GrantWait:
        return GrantWait(
            code_upload.DEPLOYER_ROLE, log=waits.append, sleep=clock.advance, clock=clock
        )

    monkeypatch.setattr(code_upload, "grant_wait", grant_wait)

    def deploy(caller: str):
        network = blob_front(
            code_stack_plan,
            late.grants,
            propagation_s=PROPAGATION_S,
            aliases={NODES: IDENTITY},
            caller=caller,
        )
        code = late.storage.container("code")
        if not code.exists():
            code.create_container()
        return late, network, waits

    return deploy


def _upload(late):
    from infra.code_upload import CodeUploadProvider

    snap = snapshot("examples/torchrun_ddp", REPO)
    endpoint = late.storage.blob_endpoint
    props = {"folder": snap.folder, "sha256": snap.sha256, "blob_endpoint": endpoint}
    return snap, CodeUploadProvider().create(props)


def test_a_code_job_deploys_from_a_laptop_the_stack_admits_and_the_nodes_fetch_it(
    stack_storage, tmp_path, monkeypatch
):
    late, network, waits = stack_storage(CLIENT_IP)
    snap, made = _upload(late)
    assert made.outs["url"].endswith(f"/code/{snap.blob_name}")
    assert late.storage.container("code").download_blob(snap.blob_name).readall() == snap.data
    # The deployer's grant was waited out, one line per wait, each naming the role.
    assert waits and all("Storage Blob Data Contributor" in line for line in waits)
    assert (DEPLOYER_OBJECT_ID, "PUT") in {(who, method) for who, method, _ in late.grants.denied}
    assert network.refused == []
    # The nodes, through their subnet, with their own identity's Reader on `code`.
    from tests.conftest import act_as_identity_of
    from trainer.common.grant_wait import GrantWait
    from trainer.launch.code_folder import ready

    network.caller = SUBNET
    act_as_identity_of(late.storage, monkeypatch)
    folder = ready(
        late.storage.blob_endpoint,
        snap.sha256,
        tmp_path / "cache",
        GrantWait("Storage Blob Data Reader", 0, log=lambda _: None),
        log=lambda _: None,
    )
    source = (REPO / "examples/torchrun_ddp/train.py").read_bytes()
    assert (folder / "src/train.py").read_bytes() == source


def test_a_runner_outside_the_storage_firewall_is_one_line_naming_the_setting(stack_storage):
    from infra.code_upload import CodeUploadError

    late, network, waits = stack_storage("203.0.113.200")
    with pytest.raises(CodeUploadError) as refused:
        _upload(late)
    message = str(refused.value)
    assert "\n" not in message and FIREWALL in message
    assert "storageAllowedIps" in message and "jobs.<name>.code='examples/torchrun_ddp'" in message
    assert network.refused and not waits  # refused by the network, not waited on as a grant


def test_a_code_job_in_a_stack_that_admits_no_address_is_refused_when_planned():
    with pytest.raises(ConfigError) as refused:
        StackSettings.from_mapping("dev", _values([]), load_schema())
    message = str(refused.value)
    assert message.startswith("jobs.mine.code='examples/torchrun_ddp': ")
    assert "storageAllowedIps" in message and "\n" not in message


@pytest.mark.parametrize("preview", [True, False])
def test_the_code_stack_grants_the_deployer_the_code_container_before_the_upload(request, preview):
    if preview:
        plan = evaluate("dev", _values([CLIENT_IP]), preview=True)
    else:
        plan = request.getfixturevalue("code_stack_plan")
    (grant,) = [r for r in plan.resources if r.name == "platform-dev-deployer-code"]
    assert grant.inputs["principalId"] == DEPLOYER_OBJECT_ID
    assert grant.inputs["principalType"] == "User"
    assert grant.inputs["roleDefinitionId"].endswith("/ba92f5b4-2d11-453d-a403-e96b0029c9fe")
    if not preview:  # the account's id is known only once it exists
        assert grant.inputs["scope"].endswith("/blobServices/default/containers/code")
    sha = snapshot("examples/torchrun_ddp", REPO).sha256
    assert "platform-dev-deployer-code" in plan.dependencies[f"platform-dev-code-{sha[:12]}"]
