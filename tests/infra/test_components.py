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
    from infra.config import NetworkSettings
    from infra.network import Network

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
