"""What the Pulumi engine and ARM do with the program's declarations: the dependencies the
engine orders creation by (as the SDK sends them in RegisterResource), the resource options it
acts on, preview mode with unknown outputs, and the config rules that stand in for ARM's."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dt_commands.plan import Plan, evaluate, render
from infra.budget import BUDGET_START_PROPERTY
from infra.cloud_init import ready_command
from infra.identity import BATCH_JOB_SUBMITTER, deployer_principal_type
from infra.nfs import CUSTOM_DATA_PROPERTY
from infra.settings import budget as budget_section
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from infra.settings.values import load_schema
from tests.infra.fake_arm import arm_creates_budget
from tests.support.stacks import STACKS, of_type, one, stack_values

TEAM_GROUP = "33333333-3333-3333-3333-333333333333"


def _at(inputs: dict, path: str):
    """The value at a Pulumi property path (``osProfile.customData``) of a resource's inputs."""
    value = inputs
    for key in path.split("."):
        value = value[key]
    return value


@pytest.mark.parametrize("stack", STACKS)
def test_the_program_evaluates_as_a_preview_with_every_computed_output_unknown(stack):
    plan = evaluate(stack, stack_values(stack), preview=True)
    declared = {r.typ for r in plan.resources}
    assert {"azure-native:batch:Pool", "pulumi-python:dynamic:Resource"} <= declared
    # Nothing computed is known in a preview, so no output resolves (and nothing crashed).
    assert plan.outputs == {}


def test_nodes_mount_the_nfs_server_only_after_cloud_init_finished(dev_plan):
    pool = one(dev_plan, "azure-native:batch:Pool")
    ready = one(dev_plan, "azure-native:compute:VirtualMachineExtension", "-nfs-ready")
    vm = one(dev_plan, "azure-native:compute:VirtualMachine")
    # The gate tests/infra/test_cloud_init.py runs with stub tools, sent as a protected setting.
    assert ready.inputs["protectedSettings"] == {"commandToExecute": ready_command()}
    # The engine creates the pool after the extension (and so the VM and its NIC) is done.
    assert ready.name in dev_plan.dependencies[pool.name]
    assert vm.name in dev_plan.dependencies[ready.name]


def test_nodes_mount_the_azure_files_share_only_after_it_exists(prod_plan):
    pool = one(prod_plan, "azure-native:batch:Pool")
    share = one(prod_plan, "azure-native:storage:FileShare", "-share")
    assert share.name in prod_plan.dependencies[pool.name]
    source = pool.inputs["mountConfiguration"][0]["nfsMountConfiguration"]["source"]
    assert source.endswith(f"/{share.inputs['shareName']}")
    # Root is not squashed: the start task (root on the node) makes the runs folder.
    assert share.inputs["rootSquash"] == "NoRootSquash"


def test_new_cloud_init_replaces_the_nfs_vm_and_keeps_its_data_disks(dev_plan):
    vm = one(dev_plan, "azure-native:compute:VirtualMachine")
    options = dev_plan.options[vm.name]
    assert options.replace_on_changes == [CUSTOM_DATA_PROPERTY]
    assert options.delete_before_replace is True
    assert _at(vm.inputs, CUSTOM_DATA_PROPERTY)  # the path names a property the VM really has
    disks = of_type(dev_plan, "azure-native:compute:Disk")
    assert disks and all(d.protect for d in disks)
    assert {d["deleteOption"] for d in vm.inputs["storageProfile"]["dataDisks"]} == {"Detach"}


def _submitters(plan):
    return [
        r
        for r in of_type(plan, "azure-native:authorization:RoleAssignment")
        if r.inputs["roleDefinitionId"].endswith(BATCH_JOB_SUBMITTER)
    ]


def test_the_deployer_always_submits_jobs_and_nobody_gets_pool_rights(plan):
    from dt_commands.mocks import DEPLOYER_OBJECT_ID

    by_principal = {r.inputs["principalId"]: r for r in _submitters(plan)}
    deployer = by_principal.pop(DEPLOYER_OBJECT_ID)
    assert deployer.inputs["principalType"] == deployer_principal_type()
    # Besides the deployer, only the stack's team group (every example stack names one).
    assert [r.inputs["principalType"] for r in by_principal.values()] == ["Group"]
    # A later deployer replaces this assignment; the earlier one keeps its grant.
    assert plan.options[deployer.name].retain_on_delete is True
    assert not any(plan.options[r.name].retain_on_delete for r in by_principal.values())
    # Nobody who only submits jobs gets Batch Data Contributor (pool resize and delete).
    roles = [
        r.inputs["roleDefinitionId"]
        for r in of_type(plan, "azure-native:authorization:RoleAssignment")
    ]
    assert not any(role.endswith("6aaa78f1-f7de-44ca-8722-c64a23943cae") for role in roles)


@pytest.mark.parametrize(
    ("env", "az_says", "expected"),
    [
        # CI: azure-native authenticates as the service principal from ARM_CLIENT_ID (OIDC).
        ({"ARM_CLIENT_ID": "app", "ARM_USE_OIDC": "true"}, None, "ServicePrincipal"),
        ({"ARM_USE_MSI": "true"}, None, "ServicePrincipal"),
        # A laptop: the Azure CLI's login, a person or `az login --service-principal`.
        ({}, "user", "User"),
        ({}, "servicePrincipal", "ServicePrincipal"),
        ({}, None, "User"),
    ],
)
def test_the_deployers_principal_type_is_the_one_azure_native_signs_in_as(
    tmp_path, env, az_says, expected
):
    path = str(tmp_path)
    if az_says is not None:
        az = tmp_path / "az"
        az.write_text(
            '#!/bin/bash\n[ "$*" = "account show --query user.type -o tsv" ] || exit 2\n'
            f"echo {az_says}\n"
        )
        az.chmod(0o755)
    assert deployer_principal_type({**env, "PATH": path}) == expected


def test_the_team_group_is_granted_besides_the_deployer():
    from dt_commands.mocks import DEPLOYER_OBJECT_ID

    plan = evaluate("dev", {**stack_values("dev"), "gpu-cluster:jobSubmitterObjectId": TEAM_GROUP})
    by_principal = {r.inputs["principalId"]: r for r in _submitters(plan)}
    assert set(by_principal) == {DEPLOYER_OBJECT_ID, TEAM_GROUP}
    assert by_principal[TEAM_GROUP].inputs["principalType"] == "Group"
    names = {r.inputs["roleAssignmentName"] for r in by_principal.values()}
    assert len(names) == 2  # distinct, deterministic assignment GUIDs


def test_jobs_that_ci_deploys_need_a_team_group_to_operate_them(monkeypatch):
    # CI's OIDC login: azure-native authenticates as the service principal in ARM_CLIENT_ID.
    monkeypatch.setenv("ARM_CLIENT_ID", "44444444-4444-4444-4444-444444444444")
    values = {**stack_values("dev"), "gpu-cluster:jobSubmitterObjectId": ""}
    with pytest.raises(ConfigError, match=r"^jobSubmitterObjectId is empty while a service "):
        evaluate("dev", values)
    # A person's own deploy grants the person; a stack without jobs has nothing to operate.
    monkeypatch.delenv("ARM_CLIENT_ID")
    assert evaluate("dev", values).outputs["jobs"]
    monkeypatch.setenv("ARM_CLIENT_ID", "44444444-4444-4444-4444-444444444444")
    assert "jobs" not in evaluate("dev", {**values, "gpu-cluster:submitJob": False}).outputs


def test_a_budget_starts_this_month_and_never_moves_afterwards(monkeypatch, plan):
    budget = one(plan, "azure-native:consumption:Budget")
    assert budget.inputs["timePeriod"]["startDate"] == f"{budget_section.current_month()}-01"
    assert plan.options[budget.name].ignore_changes == [BUDGET_START_PROPERTY]
    assert _at(budget.inputs, BUDGET_START_PROPERTY)


@pytest.fixture(scope="module")
def budget_plan() -> Callable[[str, str], Plan]:
    """The dev stack with ``budgetStartMonth`` set, evaluated under mocks while
    ``current_month`` answers ``month``: at most once per (start month, month) for this module.
    The past-start test and the first case of the start-Azure-takes test ask for the same
    (2026-12 in 2027-01); the tests only read the plan, and run the budget's hook under their
    own ``current_month``."""
    plans: dict[tuple[str, str], Plan] = {}

    def plan(start_month: str, month: str) -> Plan:
        if (start_month, month) not in plans:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(budget_section, "current_month", lambda: month)
                values = {**stack_values("dev"), "budgetStartMonth": start_month}
                plans[start_month, month] = evaluate("dev", values)
        return plans[start_month, month]

    return plan


def _budget_hook(plan):
    """The hook the engine runs before it creates the budget, and the budget's inputs."""
    budget = one(plan, "azure-native:consumption:Budget")
    hooks = plan.options[budget.name].hooks
    (hook,) = hooks.before_create
    assert not (hooks.before_update or hooks.after_update)  # never on an update
    assert hook.opts.on_dry_run  # a preview (pulumi up's own first) stops before any create
    return hook, budget


def _engine_creates(hook, budget) -> None:
    """What the engine does before it creates the budget: run the hook with the new inputs."""
    from pulumi import ResourceHookArgs

    urn = f"urn:pulumi:dev::gpu-cluster::azure-native:consumption:Budget::{budget.name}"
    hook(ResourceHookArgs(urn, "", budget.name, budget.typ, new_inputs=budget.inputs))


def test_a_past_budget_start_month_keeps_an_existing_stack_deployable(monkeypatch, budget_plan):
    """The month after the budget was made, its start month has passed: an update of the stack
    (no create of the budget) must still evaluate, and the start is not sent again."""
    monkeypatch.setattr(budget_section, "current_month", lambda: "2027-01")
    plan = budget_plan("2026-12", "2027-01")
    _, budget = _budget_hook(plan)  # checked by the engine only before it creates the budget
    assert budget.inputs["timePeriod"]["startDate"] == "2026-12-01"
    assert plan.options[budget.name].ignore_changes == [BUDGET_START_PROPERTY]


@pytest.mark.parametrize(
    ("start_month", "today"),
    [
        ("2026-12", "2027-01-15"),  # the month has passed: refused
        ("2027-01", "2027-01-31"),
        ("2028-01", "2027-01-01"),  # twelve months ahead: the furthest Azure takes
        ("2028-02", "2027-01-01"),
        ("2026-01", "2027-01-01"),
    ],
)
def test_a_new_budget_is_created_only_with_a_start_azure_takes(
    monkeypatch, budget_plan, start_month, today
):
    monkeypatch.setattr(budget_section, "current_month", lambda: today[:7])
    plan = budget_plan(start_month, today[:7])
    hook, budget = _budget_hook(plan)
    start = budget.inputs["timePeriod"]["startDate"]
    if arm_creates_budget(start, today):
        _engine_creates(hook, budget)
        return
    with pytest.raises(ConfigError) as refused:
        _engine_creates(hook, budget)
    message = str(refused.value)
    assert message.startswith(f"budgetStartMonth={start_month}: ") and "\n" not in message
    assert "which Azure refuses for a new budget" in message and "leave it empty" in message


def test_an_empty_start_month_creates_the_budget_in_the_month_it_is_made(monkeypatch):
    monkeypatch.setattr(budget_section, "current_month", lambda: "2027-03")
    hook, budget = _budget_hook(evaluate("dev", stack_values("dev")))
    assert budget.inputs["timePeriod"]["startDate"] == "2027-03-01"
    _engine_creates(hook, budget)


def test_storage_admits_the_configured_public_addresses():
    plan = evaluate(
        "dev", {**stack_values("dev"), "storageAllowedIps": ["20.1.2.3", "52.10.0.0/24"]}
    )
    account = one(plan, "azure-native:storage:StorageAccount", "-account")
    rules = account.inputs["networkRuleSet"]["ipRules"]
    assert [(r["iPAddressOrRange"], r["action"]) for r in rules] == [
        ("20.1.2.3", "Allow"),
        ("52.10.0.0/24", "Allow"),
    ]
    assert account.inputs["networkRuleSet"]["defaultAction"] == "Deny"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("20.1.2.4/32", "takes /30 or larger ranges; give the address alone"),
        ("192.168.1.10", "not a public address"),
        ("laptop", "not an IPv4 CIDR"),
    ],
)
def test_storage_addresses_azure_refuses_are_config_errors(value, message):
    values = {**stack_values("dev"), "storageAllowedIps": [value]}
    with pytest.raises(ConfigError, match=message):
        StackSettings.from_mapping("dev", values, load_schema())


def test_the_plan_shows_the_batch_core_quota_the_pool_needs(prod_plan):
    text = render(prod_plan, 160)
    assert "dedicated cores of the Standard_ND96amsr_A100_v4 family: 4 nodes x 96 vCPUs = 384" in (
        text
    )
    assert "dedicatedCoreQuotaPerVmFamily" in text
