"""A stack's AzureML workspace (azuremlWorkspace): every property the program sets, through
Pulumi's mocks, against the constraints Azure documents for it (read 2026-11-29, MicrosoftDocs/
azure-ai-docs articles/machine-learning/ unless named): the storage and registry it may use,
the identity-based datastores a storage without shared keys needs, the private endpoint and
its zones, the vault's rules, and the nodes' right to track runs there and nothing else."""

from __future__ import annotations

import pulumi
import pytest

from dt_commands.mocks import AzureMocks, AzureRefusal, mock_resource_id
from dt_commands.plan import evaluate
from infra.workspace import DNS_ZONES, MLFLOW_ACTIONS, PRIVATE_LINK_GROUP, VAULT_RETENTION_DAYS
from tests.infra.test_image_ref import reuse
from tests.support.stacks import of_type, one, stack_values

WORKSPACE = "azure-native:machinelearningservices:Workspace"
VAULT = "azure-native:keyvault:Vault"
ASSIGNMENT = "azure-native:authorization:RoleAssignment"


@pytest.fixture(scope="module")
def ws_plan():
    return evaluate("dev", {**stack_values("dev"), "gpu-cluster:azuremlWorkspace": True})


def _id_of(plan, typ: str, suffix: str = "") -> str:
    """The id the mocks gave the one ``typ`` resource."""
    resource = one(plan, typ, suffix)
    key = {WORKSPACE: "workspaceName", VAULT: "vaultName"}.get(typ, "")
    return mock_resource_id(typ, resource.inputs.get(key, resource.name))


def test_the_default_stack_declares_no_workspace_and_no_outputs_of_one(dev_plan):
    assert not dev_plan.settings.azureml.workspace
    assert not [r for r in dev_plan.resources if "machinelearningservices" in r.typ]
    assert not of_type(dev_plan, VAULT)
    assert not [k for k in dev_plan.outputs if k.startswith("azureml_")]


def test_the_workspace_uses_the_stacks_storage_and_registry_within_azures_rules(ws_plan):
    workspace = one(ws_plan, WORKSPACE).inputs
    account = one(ws_plan, "azure-native:storage:StorageAccount", "-account").inputs
    registry = one(ws_plan, "azure-native:containerregistry:Registry").inputs
    assert workspace["storageAccount"].endswith("/" + account["accountName"])
    assert workspace["containerRegistry"].endswith("/" + registry["registryName"])
    # concept-workspace.md: not BlobStorage, not premium, no hierarchical namespace.
    assert account["kind"] == "StorageV2" and not account.get("isHnsEnabled")
    assert not account["sku"]["name"].startswith("Premium")
    # how-to-disable-local-auth-storage.md: shared keys off needs identity-based datastores.
    assert account["allowSharedKeyAccess"] is False
    assert workspace["systemDatastoresAuthMode"] == "Identity"
    # how-to-secure-workspace-vnet.md: a Premium registry and storage open to trusted services.
    assert registry["sku"]["name"] == "Premium" and registry["adminUserEnabled"] is False
    assert registry["networkRuleBypassOptions"] == "AzureServices"
    assert account["networkRuleSet"]["bypass"] == "AzureServices"
    assert workspace["identity"] == {"type": "SystemAssigned"}
    assert workspace["publicNetworkAccess"] == "Disabled" and workspace["v1LegacyMode"] is False


def test_an_image_from_elsewhere_gives_the_workspace_no_registry_of_the_stacks():
    values = {**reuse(), "azuremlWorkspace": True}
    workspace = one(evaluate("dev", values), WORKSPACE).inputs
    assert "containerRegistry" not in workspace


def test_the_vault_is_rbac_purge_protected_and_closed_but_to_trusted_services(ws_plan):
    vault = one(ws_plan, VAULT)
    properties = vault.inputs["properties"]
    assert one(ws_plan, WORKSPACE).inputs["keyVault"].endswith("/" + vault.inputs["vaultName"])
    assert properties["enableRbacAuthorization"] is True
    assert properties["enablePurgeProtection"] is True and properties["enableSoftDelete"] is True
    # keyvault VaultProperties: softDeleteRetentionInDays "accepts >=7 and <=90".
    assert 7 <= properties["softDeleteRetentionInDays"] == VAULT_RETENTION_DAYS <= 90
    assert properties["networkAcls"] == {"defaultAction": "Deny", "bypass": "AzureServices"}
    assert properties["tenantId"] == "11111111-1111-1111-1111-111111111111"
    # Key Vault names: 3-24 letters, digits and hyphens, starting with a letter.
    name = vault.inputs["vaultName"]
    assert 3 <= len(name) <= 24 and name[0].isalpha() and name.isalnum()


def test_with_protect_data_the_workspace_and_its_vault_survive_destroy(ws_plan):
    assert ws_plan.settings.protect_data
    assert one(ws_plan, WORKSPACE).protect and one(ws_plan, VAULT).protect
    values = {
        **stack_values("dev"),
        "gpu-cluster:azuremlWorkspace": True,
        "gpu-cluster:protectData": False,
    }
    unprotected = evaluate("dev", values)
    assert not one(unprotected, WORKSPACE).protect and not one(unprotected, VAULT).protect


def test_the_workspace_is_reached_through_a_private_endpoint_named_in_the_vnets_zones(ws_plan):
    endpoint = one(ws_plan, "azure-native:network:PrivateEndpoint").inputs
    [connection] = endpoint["privateLinkServiceConnections"]
    assert connection["groupIds"] == [PRIVATE_LINK_GROUP] == ["amlworkspace"]
    assert connection["privateLinkServiceId"] == _id_of(ws_plan, WORKSPACE)
    assert endpoint["subnet"]["id"].endswith("-compute")
    zones = of_type(ws_plan, "azure-native:privatedns:PrivateZone")
    assert sorted(z.inputs["privateZoneName"] for z in zones) == sorted(DNS_ZONES)
    assert {z.inputs["location"] for z in zones} == {"global"}
    links = of_type(ws_plan, "azure-native:privatedns:VirtualNetworkLink")
    assert sorted(link.inputs["privateZoneName"] for link in links) == sorted(DNS_ZONES)
    assert {link.inputs["virtualNetwork"]["id"] for link in links} == {
        _id_of(ws_plan, "azure-native:network:VirtualNetwork")
    }
    assert not any(link.inputs["registrationEnabled"] for link in links)
    group = one(ws_plan, "azure-native:network:PrivateDnsZoneGroup").inputs
    assert group["privateEndpointName"].endswith("-mlw-pe")
    assert sorted(
        c["privateDnsZoneId"].rsplit("/", 1)[1] for c in group["privateDnsZoneConfigs"]
    ) == sorted(DNS_ZONES)


def test_the_nodes_may_track_runs_and_register_models_in_the_workspace_alone(ws_plan):
    role = one(ws_plan, "azure-native:authorization:RoleDefinition").inputs
    assert role["permissions"] == [{"actions": list(MLFLOW_ACTIONS)}]
    assert not any(p.get("dataActions") or p.get("notActions") for p in role["permissions"])
    group = mock_resource_id(
        "azure-native:resources:ResourceGroup", one(ws_plan, WORKSPACE).inputs["resourceGroupName"]
    )
    assert role["scope"] == group and role["assignableScopes"] == [group]
    nodes = one(ws_plan, "azure-native:managedidentity:UserAssignedIdentity", "-nodes").name
    [grant] = [
        a for a in of_type(ws_plan, ASSIGNMENT) if a.inputs["principalId"] == f"principal-{nodes}"
        and "machinelearningservices" in a.inputs["scope"]
    ]  # fmt: skip
    assert grant.inputs["scope"] == _id_of(ws_plan, WORKSPACE)
    assert grant.inputs["roleDefinitionId"].endswith("/" + role["roleDefinitionId"])
    assert grant.inputs["principalType"] == "ServicePrincipal"
    assert "-mlflow-writer" in ws_plan.depends_on[grant.name][0]
    # Nothing else of the nodes' grants changes with a workspace.
    assert _node_grants(ws_plan) - {grant.inputs["scope"]} == _node_grants(
        evaluate("dev", stack_values("dev"))
    )


def _node_grants(plan) -> set[str]:
    nodes = one(plan, "azure-native:managedidentity:UserAssignedIdentity", "-nodes").name
    return {
        a.inputs["scope"]
        for a in of_type(plan, ASSIGNMENT)
        if a.inputs["principalId"] == f"principal-{nodes}"
    }


def test_azure_refuses_a_custom_role_assignable_on_one_resource_only():
    """The fake's refusal that kept the role at the resource group (custom-roles.md)."""
    mocks = AzureMocks()
    group = "/subscriptions/s/resourceGroups/g"
    scope = f"{group}/providers/Microsoft.MachineLearningServices/workspaces/w"
    args = pulumi.runtime.MockResourceArgs(
        typ="azure-native:authorization:RoleDefinition",
        name="writer",
        inputs={"roleName": "writer", "assignableScopes": [scope]},
        provider="",
        resource_id="",
        custom=True,
    )
    with pytest.raises(AzureRefusal, match="not a management group, subscription or resource"):
        mocks.new_resource(args)
    allowed = {**args.inputs, "assignableScopes": [group]}
    mocks.new_resource(pulumi.runtime.MockResourceArgs(**{**vars(args), "inputs": allowed}))


def test_the_outputs_name_the_workspace_its_tracking_uri_and_its_studio_page(ws_plan):
    outputs = ws_plan.outputs
    name = one(ws_plan, WORKSPACE).inputs["workspaceName"]
    assert outputs["azureml_workspace_name"] == name == "mlw-platform-dev"
    # how-to-use-mlflow-configure-tracking.md: azureml://<region>.api.azureml.ms/mlflow/v1.0/...
    assert outputs["azureml_tracking_uri"].startswith("azureml://eastus.api.azureml.ms/mlflow/")
    assert outputs["azureml_tracking_uri"].endswith(f"/workspaces/{name}")
    assert outputs["azureml_studio_url"] == (
        f"https://ml.azure.com/?wsid={_id_of(ws_plan, WORKSPACE)}"
        "&tid=11111111-1111-1111-1111-111111111111"
    )


def test_a_long_stack_name_still_gives_a_workspace_name_azure_takes():
    values = {**stack_values("dev"), "gpu-cluster:azuremlWorkspace": True}
    name = one(evaluate("a-very-long-stack-name-for-eu-west", values), WORKSPACE).inputs[
        "workspaceName"
    ]
    # Workspace names: 3-33 letters, digits, hyphens and underscores, from a letter or digit.
    assert 3 <= len(name) <= 33 and name[0].isalnum() and not name.endswith("-")
    assert all(c.isalnum() or c in "-_" for c in name)


def test_the_workspace_sends_its_logs_and_metrics_to_the_stacks_log_analytics(ws_plan):
    setting = one(ws_plan, "azure-native:monitor:DiagnosticSetting", "-azureml-diagnostics")
    assert setting.inputs["resourceUri"] == _id_of(ws_plan, WORKSPACE)
    assert setting.inputs["logs"] == [{"categoryGroup": "allLogs", "enabled": True}]


def test_the_estimate_prices_the_workspaces_endpoint_and_zones_as_the_policy_pack_reads_them(
    ws_plan, dev_plan
):
    from infra import cost, prices
    from policy.rules import cost_inputs
    from tests.policy.test_rules import policy_resources

    item = "AzureML workspace: private endpoint + 2 DNS zones"
    priced = dict(cost.monthly_cost(ws_plan.settings.cost_inputs()))
    endpoint = prices.PRIVATE_ENDPOINT_PER_HOUR * prices.HOURS_PER_MONTH  # 7.30
    assert priced[item] == pytest.approx(endpoint + 2 * prices.PRIVATE_DNS_ZONE_PER_MONTH)
    assert item not in dict(cost.monthly_cost(dev_plan.settings.cost_inputs()))
    # The pack reads the same from the declared resources (one endpoint, two zones).
    read = cost_inputs(policy_resources([(r.typ, r.inputs) for r in ws_plan.resources]))
    assert read is not None and read.azureml_workspace
    assert len(of_type(ws_plan, "azure-native:network:PrivateEndpoint")) == 1
    assert len(of_type(ws_plan, "azure-native:privatedns:PrivateZone")) == 2
