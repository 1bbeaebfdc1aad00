"""``imageRef`` in a registry of another team: the nodes' pull right is the role that
registry's mode honours. A registry in the "RBAC Registry + ABAC Repository Permissions" mode
does not honour AcrPull (tests/infra/fake_arm.py, FakeRegistry.lets_pull), so the program reads
the mode at `pulumi up` (``RegistryPullRole``, against a fake ARM) and grants Container Registry
Repository Reader there, AcrPull elsewhere; a preview shows the role as unknown."""

from __future__ import annotations

import pytest

from dt_commands.mocks import AzureMocks
from dt_commands.plan import evaluate
from tests.infra.fake_arm import REGISTRY_ID, FakeRegistry
from tests.infra.test_image_ref import REGISTRY_ID as REUSED_REGISTRY_ID
from tests.infra.test_image_ref import reuse
from tests.infra.test_registry_bypass import arm  # noqa: F401  (the fake registry's ARM)
from tests.support.stack_rights import ROLE_NAMES, declared

ABAC = "AbacRepositoryPermissions"
LEGACY = "LegacyRegistryPermissions"
PULL_ROLE = "pulumi-python:dynamic/acr:RegistryPullRole"


@pytest.mark.parametrize(
    ("mode", "role"),
    [(ABAC, "Container Registry Repository Reader"), (LEGACY, "AcrPull"), (None, "AcrPull")],
)
def test_the_pull_role_is_the_one_the_registrys_mode_honours(arm, mode, role):  # noqa: F811
    from infra.registry_mode import RegistryPullRoleProvider

    arm.role_assignment_mode = mode
    made = RegistryPullRoleProvider().create({"registry_id": REGISTRY_ID, "mode": None})
    assert made.outs["mode"] == (mode or LEGACY)
    assert ROLE_NAMES[made.outs["role"]] == role and arm.lets_pull(role)
    (read,) = [r for r in arm.requests if r["method"] == "GET"]
    assert read["path"] == REGISTRY_ID and read["query"] == {"api-version": ["2025-11-01"]}


def test_a_refresh_reads_the_mode_again(arm):  # noqa: F811
    from infra.registry_mode import RegistryPullRoleProvider

    arm.role_assignment_mode = LEGACY
    provider = RegistryPullRoleProvider()
    made = provider.create({"registry_id": REGISTRY_ID, "mode": None})
    arm.role_assignment_mode = ABAC  # its owner switched the registry since
    refreshed = provider.read(made.id, made.outs)
    assert refreshed.outs["mode"] == ABAC
    assert ROLE_NAMES[refreshed.outs["role"]] == "Container Registry Repository Reader"


@pytest.mark.parametrize(
    ("refusal", "expected"),
    [
        (
            (403, {"error": {"code": "AuthorizationFailed", "message": "no read\naccess"}}),
            "imageRegistryId=",
        ),
        ((404, {"error": {"code": "ResourceNotFound", "message": "gone"}}), "imageRegistryId="),
    ],
)
def test_a_registry_the_deployer_cannot_read_is_one_line(arm, refusal, expected):  # noqa: F811
    from infra.registry_mode import RegistryModeError, RegistryPullRoleProvider

    arm.refuse_read = refusal
    with pytest.raises(RegistryModeError) as refused:
        RegistryPullRoleProvider().create({"registry_id": REGISTRY_ID, "mode": None})
    message = str(refused.value)
    assert message.startswith(expected) and "\n" not in message
    assert "roleAssignmentMode" in message and "Reader" in message


def test_a_mode_this_program_does_not_know_is_refused_naming_it(arm):  # noqa: F811
    from infra.registry_mode import RegistryModeError, RegistryPullRoleProvider

    arm.role_assignment_mode = "SomethingNew"
    with pytest.raises(RegistryModeError) as refused:
        RegistryPullRoleProvider().create({"registry_id": REGISTRY_ID, "mode": None})
    assert "roleAssignmentMode='SomethingNew'" in str(refused.value)


def _pull_grant(plan):
    (grant,) = [r for r in declared(plan) if r.name == "platform-dev-nodes-acrpull"]
    return grant


@pytest.mark.parametrize("mode", [ABAC, LEGACY])
def test_an_image_ref_stack_grants_the_nodes_the_role_its_registry_honours(monkeypatch, mode):
    computed = AzureMocks._computed

    def answering(typ, name, inputs):
        if typ == PULL_ROLE:  # what the provider reads from ARM, as the fake registry has it
            from infra.registry_mode import PULL_ROLES

            return {"mode": mode, "role": PULL_ROLES[mode]}
        return computed(typ, name, inputs)

    monkeypatch.setattr(AzureMocks, "_computed", staticmethod(answering))
    plan = evaluate("dev", reuse())
    grant = _pull_grant(plan)
    assert grant.scope == REUSED_REGISTRY_ID
    registry = FakeRegistry(REUSED_REGISTRY_ID)
    registry.role_assignment_mode = mode
    assert registry.lets_pull(grant.role), f"{mode}: the nodes hold {grant.role}"
    (reader,) = [r for r in plan.resources if r.typ == PULL_ROLE]
    assert reader.inputs["registry_id"] == REUSED_REGISTRY_ID


def test_a_stack_with_its_own_registry_keeps_acrpull_and_reads_no_mode(dev_plan):
    assert _pull_grant(dev_plan).role == "AcrPull"
    assert not [r for r in dev_plan.resources if r.typ == PULL_ROLE]


def test_a_preview_shows_the_reused_registrys_pull_role_as_unknown():
    plan = evaluate("dev", reuse(), preview=True)
    (grant,) = [r for r in plan.resources if r.name == "platform-dev-nodes-acrpull"]
    assert not isinstance(grant.inputs.get("roleDefinitionId"), str)
