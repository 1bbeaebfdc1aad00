"""The AzureML backend (backend: azureml): the stack's nodes as an AzureML compute cluster and
the trainer image as its environment, every property through Pulumi's mocks against what Azure
documents for it (read 2026-11-29, MicrosoftDocs/azure-ai-docs articles/machine-learning/):
how-to-create-attach-compute-cluster.md (the name; scale to zero; low priority),
how-to-secure-training-vnet.md (no public IP: the workspace's private endpoint, a NAT gateway),
how-to-identity-based-service-authentication.md (the compute's identity pulls the image),
concept-environments.md (an immutable version per image); and what the backend leaves out
(Batch, the NFS server) and refuses (an acceptance stack, a tracking server)."""

from __future__ import annotations

import re

import pytest

from dt_commands.mocks import mock_resource_id
from dt_commands.plan import evaluate, render
from infra.azureml_compute import ENVIRONMENT, environment_version
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from infra.settings.values import load_schema
from infra.sizes import SUPPORTED
from tests.infra.test_image_ref import REF, reuse
from tests.support.stacks import of_type, one, stack_values

COMPUTE = "azure-native:machinelearningservices:Compute"
ENVIRONMENT_VERSION = "azure-native:machinelearningservices:EnvironmentVersion"
AZUREML = {"gpu-cluster:backend": "azureml", "gpu-cluster:submitJob": False}
# how-to-create-attach-compute-cluster.md: 3-24 letters, digits and '-', from a letter.
COMPUTE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{2,23}$")


def azureml(stack: str = "dev", **changes) -> dict:
    return {**stack_values(stack), **AZUREML, **{f"gpu-cluster:{k}": v for k, v in changes.items()}}


@pytest.fixture(scope="module")
def aml_plan():
    return evaluate("dev", azureml())


def test_the_backend_declares_a_workspace_compute_and_environment_and_no_batch_or_nfs(aml_plan):
    types = {r.typ for r in aml_plan.resources}
    assert {COMPUTE, ENVIRONMENT_VERSION, "azure-native:machinelearningservices:Workspace"} <= types
    assert not [t for t in types if t.startswith("azure-native:batch:")]
    # AzureML compute does not mount the stack's NFS server: none is declared.
    assert not of_type(aml_plan, "azure-native:compute:VirtualMachine")
    assert not of_type(aml_plan, "azure-native:compute:Disk")
    assert not of_type(aml_plan, "azure-native:storage:FileShare")
    diagnostics = {r.name for r in of_type(aml_plan, "azure-native:monitor:DiagnosticSetting")}
    assert diagnostics == {"platform-dev-blob-diagnostics", "platform-dev-azureml-diagnostics"}
    outputs = aml_plan.outputs
    assert not {"pool_id", "batch_account_endpoint", "nfs_address", "jobs"} & set(outputs)
    assert outputs["azureml_compute_name"] == one(aml_plan, COMPUTE).name  # the mocks' name
    assert outputs["azureml_environment_id"] == mock_resource_id(
        ENVIRONMENT_VERSION, one(aml_plan, ENVIRONMENT_VERSION).name
    )


def test_the_backend_evaluates_as_a_preview_with_every_computed_output_unknown():
    plan = evaluate("dev", azureml(), preview=True)
    assert {COMPUTE, ENVIRONMENT_VERSION} <= {r.typ for r in plan.resources}
    assert plan.outputs == {}  # nothing computed is known in a preview, and nothing crashed


def test_the_compute_is_the_pools_size_in_the_compute_subnet_without_public_ips(aml_plan):
    compute = one(aml_plan, COMPUTE).inputs
    cluster = aml_plan.settings.cluster
    outer = compute["properties"]
    aml = outer["properties"]
    assert outer["computeType"] == "AmlCompute" and outer["disableLocalAuth"] is True
    assert aml["vmSize"] == cluster.vm_size and aml["vmSize"] in SUPPORTED
    assert aml["osType"] == "Linux" and aml["vmPriority"] == "Dedicated"
    # how-to-secure-training-vnet.md: no public IP, no public SSH port, in the stack's subnet
    # (whose NAT gateway and the workspace's private endpoint are its way out).
    assert aml["enableNodePublicIp"] is False
    assert aml["remoteLoginPortPublicAccess"] == "Disabled"
    assert aml["subnet"]["id"] == mock_resource_id(
        "azure-native:network:Subnet", "platform-dev-compute"
    )
    assert aml["isolatedNetwork"] is False
    name = compute["computeName"]
    assert COMPUTE_NAME.match(name) and name.startswith("platform"), name
    assert (
        compute["workspaceName"]
        == one(aml_plan, "azure-native:machinelearningservices:Workspace").inputs["workspaceName"]
    )
    assert compute["tags"]["stack"] == "dev" and compute["location"] == "eastus"


def test_the_compute_names_of_two_stacks_differ_as_azure_requires_in_a_region():
    from infra.naming import compute_name

    names = {compute_name(team="platform", stack=stack) for stack in ("dev", "prod", "dev2")}
    assert len(names) == 3 and all(COMPUTE_NAME.match(n) for n in names)
    longest = compute_name(team="abcdefghijkl", stack="x")
    assert COMPUTE_NAME.match(longest), longest


def test_the_compute_scales_to_zero_after_the_idle_minutes_up_to_node_count(aml_plan):
    scale = one(aml_plan, COMPUTE).inputs["properties"]["properties"]["scaleSettings"]
    cluster = aml_plan.settings.cluster
    assert cluster.scale_mode == "autoscale"
    assert scale["minNodeCount"] == 0 and scale["maxNodeCount"] == cluster.node_count
    assert scale["nodeIdleTimeBeforeScaleDown"] == f"PT{cluster.idle_minutes}M"


def test_fixed_scale_keeps_its_nodes_and_spot_is_low_priority():
    plan = evaluate("dev", azureml(scaleMode="fixed", spot=True, nodeCount=3))
    aml = one(plan, COMPUTE).inputs["properties"]["properties"]
    assert aml["scaleSettings"]["minNodeCount"] == aml["scaleSettings"]["maxNodeCount"] == 3
    assert aml["vmPriority"] == "LowPriority"


def test_the_compute_runs_as_the_nodes_identity_once_its_roles_and_the_endpoint_exist(aml_plan):
    compute = one(aml_plan, COMPUTE)
    identity = compute.inputs["identity"]
    nodes = mock_resource_id(
        "azure-native:managedidentity:UserAssignedIdentity", "platform-dev-nodes"
    )
    assert identity == {"type": "UserAssigned", "userAssignedIdentities": [nodes]}
    after = set(aml_plan.depends_on[compute.name])
    # The identity's registry pull (how-to-identity-based-service-authentication.md) and
    # the workspace's private endpoint with its names (how-to-secure-training-vnet.md).
    assert "platform-dev-nodes-acrpull" in after, after
    assert {"platform-dev-mlw-pe-dns", "platform-dev-nodes-mlflow"} <= after, after


def test_the_environment_is_the_stacks_image_at_a_version_of_its_own(aml_plan):
    environment = one(aml_plan, ENVIRONMENT_VERSION).inputs
    image = aml_plan.outputs["image_ref"]
    assert environment["name"] == ENVIRONMENT
    assert environment["version"] == environment_version(image)
    assert environment["properties"]["image"] == image
    assert environment["properties"]["osType"] == "Linux"
    assert environment["workspaceName"] == one(aml_plan, COMPUTE).inputs["workspaceName"]
    # concept-environments.md: a version never changes; a new image is a new version.
    assert environment_version(image + "x") != environment_version(image)
    reused = one(evaluate("dev", {**reuse(), **AZUREML}), ENVIRONMENT_VERSION).inputs
    assert reused["properties"]["image"] == REF
    assert reused["version"] == environment_version(REF)


def _refusal(values: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        StackSettings.from_mapping("dev", values, load_schema())
    line = str(caught.value)
    assert "\n" not in line
    return line


def test_a_backend_of_neither_kind_is_refused_in_one_line():
    line = _refusal(azureml(backend="aks"))
    assert line == "backend='aks': use batch or azureml"


def test_an_acceptance_stack_or_a_tracking_server_does_not_go_with_the_azureml_backend():
    line = _refusal(azureml(acceptanceProfile="gpu", protectData=False))
    assert line.startswith("backend=azureml with acceptanceProfile=gpu: ")
    line = _refusal(azureml(trackingUri="http://10.0.3.4:5000"))
    assert line.startswith("trackingUri='http://10.0.3.4:5000' with backend=azureml: ")
    assert "set backend batch" in line


def test_the_plan_prices_the_compute_without_an_nfs_server_and_names_azuremls_quota(aml_plan):
    text = render(aml_plan, 160)
    assert "AzureML compute quota needed" in text and "Batch account quota" not in text
    assert "Microsoft.MachineLearningServices/locations/eastus/quotas" in text
    assert "192" in text  # 2 nodes x 96 vCPUs
    assert "NFS" not in text.split("Estimated monthly cost")[1]
    assert "AzureML workspace: private endpoint + 2 DNS zones" in text
    assert "Node OS disk: AzureML's own" in text
