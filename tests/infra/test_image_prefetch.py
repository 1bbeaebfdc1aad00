"""The pool prefetches the trainer image as its nodes join, under Pulumi's mocks: every build
moves one tag the pool names, so a trainer edit never changes the pool (whose container images
Batch changes only while it has no nodes) and a job's tasks pull only what the edit changed."""

from dt_commands.plan import evaluate
from infra import stack as stack_module
from infra.image import PREFETCH_IMAGE_NAME
from infra.settings.image import acr_image
from tests.infra.test_image_ref import reused_plan  # noqa: F401  # fixture
from tests.support.stacks import one, stack_values

POOL = "azure-native:batch:Pool"
BUILD = "pulumi-python:dynamic/acr:ImageBuild"


def _container_configuration(plan) -> dict:
    pool = one(plan, POOL).inputs
    return pool["deploymentConfiguration"]["virtualMachineConfiguration"]["containerConfiguration"]


def test_the_pool_prefetches_the_tag_each_build_moves_from_the_stacks_registry(dev_plan):
    containers = _container_configuration(dev_plan)
    login = dev_plan.outputs["registry_login_server"]
    assert containers["containerImageNames"] == [f"{login}/{PREFETCH_IMAGE_NAME}"]
    # The same registry and identity the tasks pull with; the same repository as the job's image.
    (registry,) = containers["containerRegistries"]
    assert registry["registryServer"] == login
    prefetched = acr_image(containers["containerImageNames"][0])
    job = acr_image(dev_plan.outputs["image_ref"])
    assert prefetched and job, "both are references to an image in an Azure registry"
    assert prefetched["server"] == job["server"] == login
    assert prefetched["repository"] == job["repository"] == "trainer"
    assert prefetched["tag"] == "prefetch" and not prefetched["digest"]
    assert job["tag"] != "prefetch" and job["digest"]  # what a task runs never moves


def test_the_pool_waits_for_its_nodes_roles_and_the_build_that_pushes_what_they_prefetch(
    dev_plan,
):
    """A node whose prefetch fails (no such tag yet, no pull role yet) is unusable and Batch does
    not recover it: the pool is created after both, the ordering on the pool itself."""
    pool = one(dev_plan, POOL)
    stem = dev_plan.outputs["resource_group_name"][3:]
    build = one(dev_plan, BUILD)
    acr_pull = one(dev_plan, "azure-native:authorization:RoleAssignment", "-nodes-acrpull")
    assert build.name == f"{stem}-build"
    assert {build.name, acr_pull.name} <= dev_plan.dependencies[pool.name]


def test_a_trainer_edit_changes_the_build_and_the_job_but_never_the_pool(monkeypatch):
    plans = []
    for tag in ("1111111111111111", "2222222222222222"):
        monkeypatch.setattr(stack_module, "content_tag", lambda tag=tag: tag)
        plans.append(evaluate("dev", stack_values("dev")))
    before, after = plans
    assert one(before, BUILD).inputs["image"] != one(after, BUILD).inputs["image"]
    assert before.outputs["image_ref"] != after.outputs["image_ref"]
    assert one(before, POOL).inputs == one(after, POOL).inputs


def test_an_image_ref_from_another_registry_is_not_prefetched(reused_plan):  # noqa: F811
    """A new imageRef would change the pool, which Batch accepts only without nodes."""
    assert "containerImageNames" not in _container_configuration(reused_plan)
    assert not any(r.typ == BUILD for r in reused_plan.resources)
