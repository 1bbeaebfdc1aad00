"""Component tests in Pulumi's own style: the assertions run inside an Output callback that the
``@pulumi.runtime.test`` function returns, so they run after registration completes."""

import pulumi
import pytest

from dt_commands.mocks import AzureMocks
from infra.naming import Placement


@pytest.fixture
def mocks():
    recorder = AzureMocks()
    pulumi.runtime.set_mocks(recorder, project="gpu-cluster", stack="unit", preview=False)
    return recorder


PLACE = Placement("rg-unit", "eastus", {"team": "unit"})


@pulumi.runtime.test
def test_network_chains_subnets_and_scopes_nfs(mocks):
    from infra.network import Network
    from infra.settings.network import NetworkSettings

    cidrs = NetworkSettings(
        vnet_cidr="10.1.0.0/16",
        compute_subnet_cidr="10.1.0.0/20",
        storage_subnet_cidr="10.1.16.0/24",
    )
    net = Network("unit", cidrs, PLACE)

    def check(ids):
        compute_id, storage_id = ids
        assert compute_id.endswith("/unit-compute") and storage_id.endswith("/unit-storage")
        subnets = [r for r in mocks.resources if r.typ == "azure-native:network:Subnet"]
        assert [s.inputs["addressPrefix"] for s in subnets] == ["10.1.0.0/20", "10.1.16.0/24"]
        nsg = next(r for r in mocks.resources if r.name == "unit-storage-nsg")
        allow = nsg.inputs["securityRules"][0]
        assert (allow["access"], allow["sourceAddressPrefix"]) == ("Allow", "10.1.0.0/20")

    return pulumi.Output.all(net.compute_subnet_id, net.storage_subnet_id).apply(check)


@pulumi.runtime.test
def test_registry_exposes_its_login_server(mocks):
    from infra.registry import Registry, RegistryArgs

    registry = Registry("unit", RegistryArgs(PLACE, "unitacr12345678", ["198.51.100.7"]))

    def check(login_server):
        assert login_server == "unitacr12345678.azurecr.io"
        acr = next(r for r in mocks.resources if r.typ == "azure-native:containerregistry:Registry")
        assert acr.inputs["adminUserEnabled"] is False
        # Disabled needs public access disabled (acr-export-policy-needs-private-registry).
        assert acr.inputs["publicNetworkAccess"] == "Enabled"
        assert acr.inputs["policies"]["exportPolicy"]["status"] == "enabled"

    return registry.login_server.apply(check)


@pulumi.runtime.test
def test_node_blob_grants_are_scoped_to_their_containers(mocks):
    from infra.identity import (
        NODE_BLOB_ROLES,
        STORAGE_BLOB_DATA_CONTRIBUTOR,
        STORAGE_BLOB_DATA_READER,
        Identities,
        IdentitiesArgs,
    )
    from infra.storage import CONTAINERS, Storage, StorageArgs

    store = Storage("unit", StorageArgs(PLACE, "unitdata12345678", ["subnet-id"]))
    ids = Identities(
        "unit",
        IdentitiesArgs(
            placement=PLACE,
            subscription_id="sub",
            registry_id="registry-id",
            storage_account_id=store.account_id,
            blob_containers=store.containers,
        ),
    )
    blob = ids.assignments[1:]  # after AcrPull

    def check(values):
        account_id, *pairs = values
        granted = {
            scope.removeprefix(f"{account_id}/blobServices/default/containers/"): role
            for scope, role in zip(pairs[::2], pairs[1::2], strict=True)
        }
        assert set(granted) == set(CONTAINERS)  # each scope is one container, none the account
        base = "/subscriptions/sub/providers/Microsoft.Authorization/roleDefinitions/"
        reader, contributor = base + STORAGE_BLOB_DATA_READER, base + STORAGE_BLOB_DATA_CONTRIBUTOR
        assert granted["code"] == granted["datasets"] == reader
        # The checkpoint mirror writes and prunes its copies there (trainer.checkpoints.mirror).
        assert granted["logs"] == granted["outputs"] == granted["checkpoints"] == contributor
        assert {c: r.rsplit("/", 1)[-1] for c, r in granted.items()} == NODE_BLOB_ROLES

    outputs = [x for a in blob for x in (a.scope, a.role_definition_id)]
    return pulumi.Output.all(store.account_id, *outputs).apply(check)
