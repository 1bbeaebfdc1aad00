"""``imageRef``: a stack that runs an image built before. Under Pulumi's mocks: nothing is
built and no registry is created; the pool and the job pull that reference from its registry;
the nodes' identity gets AcrPull on that registry alone; a tag without a digest is warned
about in the plan. And the settings a careful engineer would refuse, refused in one line."""

from __future__ import annotations

import logging

import pytest

from dt_commands.plan import Plan, evaluate
from infra.identity import ACR_PULL
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from tests.support.stacks import of_type, one, stack_values

SUB = "00000000-0000-0000-0000-00000000abcd"
REGISTRY_ID = (
    f"/subscriptions/{SUB}/resourceGroups/rg-images/providers/"
    "Microsoft.ContainerRegistry/registries/TeamImages"
)
DIGEST = "sha256:" + "3f" * 32
REF = f"teamimages.azurecr.io/trainer@{DIGEST}"
BUILDS = ("containerregistry:Task", "containerregistry:Registry", ":ImageBuild", ":Image")


def reuse(ref: str = REF, registry_id: str = REGISTRY_ID) -> dict:
    return {**stack_values("dev"), "imageRef": ref, "imageRegistryId": registry_id}


@pytest.fixture(scope="module")
def reused_plan() -> Plan:
    return evaluate("dev", reuse())


def test_an_image_ref_builds_nothing_and_creates_no_registry(reused_plan):
    built = [r.typ for r in reused_plan.resources if r.typ.endswith(BUILDS)]
    assert built == []
    assert reused_plan.outputs["image_ref"] == REF
    assert reused_plan.outputs["image_digest"] == DIGEST
    assert reused_plan.outputs["registry_login_server"] == "teamimages.azurecr.io"


def test_the_pool_and_the_job_pull_the_ref_from_its_registry_with_the_nodes_identity(
    reused_plan,
):
    pool = one(reused_plan, "azure-native:batch:Pool")
    vm = pool.inputs["deploymentConfiguration"]["virtualMachineConfiguration"]
    (registry,) = vm["containerConfiguration"]["containerRegistries"]
    assert registry["registryServer"] == "teamimages.azurecr.io"
    nodes = one(reused_plan, "azure-native:managedidentity:UserAssignedIdentity", "-nodes")
    assert registry["identityReference"]["resourceId"].endswith(f"/{nodes.name}")
    assert pool.inputs["identity"]["userAssignedIdentities"] == [
        registry["identityReference"]["resourceId"]
    ]
    job = one(reused_plan, "pulumi-python:dynamic:Resource")
    assert job.inputs["image_ref"] == REF
    assert job.inputs["registry_server"] == "teamimages.azurecr.io"


def test_the_nodes_get_acrpull_on_that_registry_alone(reused_plan):
    pulls = [
        r
        for r in of_type(reused_plan, "azure-native:authorization:RoleAssignment")
        if r.inputs["roleDefinitionId"].endswith(ACR_PULL)
    ]
    (pull,) = pulls
    assert pull.name.endswith("-nodes-acrpull")
    assert pull.inputs["scope"] == REGISTRY_ID  # least privilege: not its resource group
    assert pull.inputs["principalType"] == "ServicePrincipal"


def test_a_tag_without_a_digest_is_warned_about_in_the_plan(caplog):
    with caplog.at_level(logging.WARNING):
        plan = evaluate("dev", reuse("teamimages.azurecr.io/trainer:v3"))
    assert plan.outputs["image_ref"] == "teamimages.azurecr.io/trainer:v3"
    assert plan.outputs["image_digest"] == ""
    warned = [r.getMessage() for r in caplog.records if "imageRef=" in r.getMessage()]
    assert warned and "a tag, not a digest" in warned[0] and "@sha256:" in warned[0]


def test_a_build_still_pushes_to_the_stacks_own_registry(dev_plan):
    assert one(dev_plan, "azure-native:containerregistry:Registry")
    pull = one(dev_plan, "azure-native:authorization:RoleAssignment", "-nodes-acrpull")
    registry = dev_plan.outputs["registry_login_server"].removesuffix(".azurecr.io")
    assert pull.inputs["scope"].endswith(f"/{registry}")  # the stack's own registry
    assert [r for r in dev_plan.resources if r.typ.endswith(":ImageBuild")]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"imageRef": f"ghcr.io/example/trainer@{DIGEST}"},
            "only an Azure container registry accepts",
        ),
        ({"imageRef": "teamimages.azurecr.io/trainer"}, "neither a digest nor a tag"),
        ({"imageRegistryId": ""}, "imageRegistryId=(empty): imageRef's registry teamimages"),
        (
            {"imageRegistryId": REGISTRY_ID.replace("TeamImages", "otherimages")},
            "needs its ARM id",
        ),
        ({"imageRef": ""}, "imageRegistryId=/subscriptions/"),
    ],
)
def test_refs_the_nodes_could_not_pull_are_refused_in_one_line(schema, changes, message):
    with pytest.raises(ConfigError) as caught:
        StackSettings.from_mapping("dev", {**reuse(), **changes}, schema)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_ref_makes_the_build_settings_irrelevant(schema):
    s = StackSettings.from_mapping("dev", {**reuse(), "imageSourceRepo": "not a url"}, schema)
    assert s.image.ref == REF and s.image.registry_id == REGISTRY_ID


def test_the_monthly_estimate_leaves_out_the_registry_it_does_not_declare(schema):
    from infra import cost

    def items(values: dict) -> list[str]:
        s = StackSettings.from_mapping("dev", values, schema)
        return [name for name, _ in cost.monthly_cost(s.cost_inputs())]

    assert "Container registry (Premium)" in items(stack_values("dev"))
    assert "Container registry (Premium)" not in items(reuse())
