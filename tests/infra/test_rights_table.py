"""docs/deploy.md's "Who may do what" and the program's role assignments, held together: every
right a principal holds on a stack (the deployer's prerequisite and every assignment the
program declares, read from its plan under Pulumi's mocks) is a row of the table, and every row
is held by one of the stacks planned here, so no principal holds a right the table does not
list and the table lists nothing the program stopped granting."""

from __future__ import annotations

import json
import re

import pytest

from dt_commands.mocks import DEPLOYER_OBJECT_ID
from dt_commands.plan import Plan, evaluate
from tests.infra.test_image_ref import reuse
from tests.support.stack_rights import SUBSCRIPTION, Assignment, rights
from tests.support.stacks import CLIENT_IP, REPO, STACKS, stack_values

TEAM_GROUP = "6b1f0c2e-9a7d-4e3b-8c5f-1d2e3f4a5b6c"
# The teams' groups the stack files name (jobSubmitterObjectId).
TEAMS = {stack_values(s).get("gpu-cluster:jobSubmitterObjectId") for s in STACKS} | {TEAM_GROUP}
CODE_JOB = {"command": "python train.py --steps 40", "code": "examples/torchrun_ddp", "nodes": 1}
_CONTAINER = re.compile(r"/blobServices/default/containers/([a-z0-9-]+)$")
# The scope column's words for each kind of ARM id the mocks give (their provider segment).
_SCOPE_KINDS = {
    "containerregistry": "registry",
    "Microsoft.ContainerRegistry": "registry",
    "batch": "Batch account",
    "storage": "data account",
    "machinelearningservices": "AzureML workspace",
}


def _stacks(dev_plan: Plan, prod_plan: Plan, acceptance_plan: Plan) -> dict[str, Plan]:
    """The stacks planned here: the two stack files and the CPU acceptance profile (the
    session's plans of them, tests/support/stacks.py), and the stacks only this table needs."""
    code = {
        **stack_values("dev"),
        "gpu-cluster:jobs": json.dumps({"mine": CODE_JOB}),
        "gpu-cluster:storageAllowedIps": json.dumps([CLIENT_IP]),
    }
    return {
        "dev": dev_plan,
        "vision-prod": prod_plan,
        "code": evaluate("dev", code),
        "acceptance": acceptance_plan,
        "imageRef": evaluate("dev", reuse()),
        "AzureML workspace": evaluate(
            "dev", {**stack_values("dev"), "gpu-cluster:azuremlWorkspace": True}
        ),
        "imageRef, ABAC": _abac_image_ref(),
        "AzureML backend": evaluate(
            "dev",
            {
                **stack_values("dev"),
                "gpu-cluster:backend": "azureml",
                "gpu-cluster:submitJob": False,
            },
        ),
    }


def _abac_image_ref() -> Plan:
    """An imageRef stack whose registry ARM reports in the ABAC mode (what the program's
    RegistryPullRole reads at `pulumi up`, answered here by the mocks)."""
    from dt_commands.mocks import AzureMocks
    from infra.registry_mode import ABAC, PULL_ROLES

    computed = AzureMocks._computed

    def answering(typ: str, name: str, inputs: dict) -> dict:
        if typ == "pulumi-python:dynamic/acr:RegistryPullRole":
            return {"mode": ABAC, "role": PULL_ROLES[ABAC]}
        return computed(typ, name, inputs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AzureMocks, "_computed", staticmethod(answering))
        return evaluate("dev", reuse())


@pytest.fixture(scope="module")
def stacks(dev_plan, prod_plan, acceptance_plan) -> dict[str, Plan]:
    """Every stack planned here, by name; read by the table test and the deployer's test. The
    stack files' and the acceptance profile's plans are the session's own (the same settings
    evaluated under mocks; nothing here changes a plan)."""
    return _stacks(dev_plan, prod_plan, acceptance_plan)


def _who(principal: str) -> str:
    if principal == DEPLOYER_OBJECT_ID:
        return "deployer"
    if principal in TEAMS:
        return "team"
    if principal.endswith("-nodes"):
        return "nodes"
    if principal.endswith("-build-task"):
        return "build task"
    raise AssertionError(f"a right held by a principal nobody documents: {principal}")


def _where(scope: str) -> str:
    if scope == SUBSCRIPTION:
        return "subscription"
    container = _CONTAINER.search(scope)
    if container:
        return f"`{container.group(1)}` container"
    provider = scope.split("/providers/", 1)[1].split("/", 1)[0]
    return _SCOPE_KINDS[provider]


def _row(right: Assignment) -> tuple[str, str, str]:
    return _who(right.principal), right.role, _where(right.scope)


def documented() -> set[tuple[str, str, str]]:
    """The (principal, role, scope) of each row of the table."""
    text = (REPO / "docs/deploy.md").read_text()
    section = text.split("### Who may do what", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    return {tuple(cell.strip() for cell in row.strip("|").split("|")[:3]) for row in rows}


def test_every_right_a_stack_grants_is_a_row_and_every_row_is_granted(stacks):
    table = documented()
    held: dict[tuple[str, str, str], set[str]] = {}
    for name, plan in stacks.items():
        for right in rights(plan):
            held.setdefault(_row(right), set()).add(name)
    undocumented = {row: names for row, names in held.items() if row not in table}
    assert not undocumented, f"rights the table does not list: {undocumented}"
    assert not table - set(held), f"rows no planned stack grants: {table - set(held)}"


def test_the_team_row_is_what_jobsubmitterobjectid_grants():
    values = {**stack_values("dev"), "gpu-cluster:jobSubmitterObjectId": TEAM_GROUP}
    team = {_row(r) for r in rights(evaluate("dev", values)) if r.principal == TEAM_GROUP}
    assert team == {
        ("team", "Azure Batch Job Submitter", "Batch account"),
        ("team", "Storage Blob Data Reader", "`logs` container"),
        ("team", "Storage Blob Data Reader", "`outputs` container"),
    }
    assert team <= documented()


def test_on_the_azureml_backend_the_team_submits_jobs_in_the_workspace_alone():
    values = {
        **stack_values("dev"),
        "gpu-cluster:jobSubmitterObjectId": TEAM_GROUP,
        "gpu-cluster:backend": "azureml",
        "gpu-cluster:submitJob": False,
    }
    team = {_row(r) for r in rights(evaluate("dev", values)) if r.principal == TEAM_GROUP}
    assert team == {
        ("team", "AzureML Data Scientist", "AzureML workspace"),
        ("team", "Storage Blob Data Reader", "`logs` container"),
        ("team", "Storage Blob Data Reader", "`outputs` container"),
    }
    assert team <= documented()


def test_the_deployer_writes_blob_data_only_for_code_and_reads_only_what_operators_see(stacks):
    deployer = {_row(r) for r in rights(stacks["dev"]) if r.principal == DEPLOYER_OBJECT_ID}
    assert deployer == {
        ("deployer", "Owner", "subscription"),
        ("deployer", "Azure Batch Job Submitter", "Batch account"),
        ("deployer", "Storage Blob Data Reader", "`logs` container"),
        ("deployer", "Storage Blob Data Reader", "`outputs` container"),
    }
    code = {_row(r) for r in rights(stacks["code"]) if r.principal == DEPLOYER_OBJECT_ID}
    assert code - deployer == {("deployer", "Storage Blob Data Contributor", "`code` container")}
