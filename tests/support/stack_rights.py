"""Who may do what on a stack, as Azure decides it: each principal holds the role assignments the
program declares for it (read from its plan under Pulumi's mocks), plus the prerequisites
docs/deploy.md lists for the deployer, and nothing else. ``blob_front`` turns them into the
Blob proxy's grants and firewall (tests/support/storage_grants.py); ``laptop_az`` is the `az`
a deployer's laptop has after `az login`, issuing tokens in that deployer's name.

Roles and what they hold (azure-docs articles/role-based-access-control/built-in-roles, and
articles/batch/batch-role-based-access-control.md for Batch; read 2026-11-28): the Storage Blob
Data roles are the only ones that reach blob data; Owner and Contributor hold every control
action and no data action."""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dt_commands.mocks import DEPLOYER_OBJECT_ID, SUBSCRIPTION_ID
from dt_commands.plan import Plan
from tests.support.storage_grants import CONTRIBUTOR, READER, Grants, NetworkRules

ASSIGNMENT = "azure-native:authorization:RoleAssignment"
ROLE_DEFINITION = "azure-native:authorization:RoleDefinition"
ROLE_NAMES = {
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "18d7d88d-d35e-4fb5-a5c3-7773c4a72b9d": "User Access Administrator",
    "17d1049b-9a84-46fb-8f53-869881c3d3ab": "Storage Account Contributor",
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": CONTRIBUTOR,
    "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1": READER,
    "7f951dda-4ed3-4680-a7ca-43fe172d538d": "AcrPull",
    "b93aa761-3e63-49ed-ac28-beffa264f7ac": "Container Registry Repository Reader",
    "8311e382-0749-4cb8-b61a-304f252e45ec": "AcrPush",
    "48e5e92e-a480-4e71-aa9c-2778f4c13781": "Azure Batch Job Submitter",
    "6aaa78f1-f7de-44ca-8722-c64a23943cae": "Azure Batch Data Contributor",
    "f6c7c914-8db3-469d-8ca1-694a8f32e121": "AzureML Data Scientist",
}
SUBSCRIPTION = f"/subscriptions/{SUBSCRIPTION_ID}"
# docs/deploy.md, Prerequisites: "Owner, or Contributor plus User Access Administrator, on the
# subscription or resource group" for whoever runs `pulumi up`.
DEPLOYER_PREREQUISITES = (("Owner", SUBSCRIPTION),)


@dataclass(frozen=True)
class Assignment:
    principal: str  # an object id
    role: str  # the built-in role's name
    scope: str  # an ARM id
    name: str = ""  # the program's resource name; "" for a prerequisite

    def covers(self, resource_id: str) -> bool:
        return resource_id == self.scope or resource_id.startswith(self.scope + "/")


def declared(plan: Plan) -> list[Assignment]:
    """The role assignments the program declares, with each role by name (a custom role the
    plan defines by its name less the resource it is for: "MLflow writer on mlw-..." is
    "MLflow writer")."""
    names = ROLE_NAMES | {
        str(r.inputs["roleDefinitionId"]): str(r.inputs["roleName"]).split(" on ", 1)[0]
        for r in plan.resources
        if r.typ == ROLE_DEFINITION
    }
    return [
        Assignment(
            str(r.inputs["principalId"]),
            names[str(r.inputs["roleDefinitionId"]).rsplit("/", 1)[1]],
            str(r.inputs["scope"]),
            r.name,
        )
        for r in plan.resources
        if r.typ == ASSIGNMENT
    ]


def rights(plan: Plan) -> list[Assignment]:
    """Everything every principal holds on the stack: the declared assignments and the
    deployer's prerequisites."""
    prerequisites = [Assignment(DEPLOYER_OBJECT_ID, r, s) for r, s in DEPLOYER_PREREQUISITES]
    return declared(plan) + prerequisites


def account(plan: Plan, typ: str, name_input: str) -> tuple[str, dict]:
    """The ARM id the mocks gave the plan's one resource of ``typ``, and its inputs."""
    (resource,) = [r for r in plan.resources if r.typ == typ]
    return (
        f"{SUBSCRIPTION}/resourceGroups/mock/providers/{typ.split(':')[1]}/"
        f"{resource.inputs[name_input]}",
        resource.inputs,
    )


def blob_front(
    plan: Plan,
    grants: Grants,
    *,
    propagation_s: float,
    aliases: dict[str, str] | None = None,
    caller: str = "198.51.100.7",
) -> NetworkRules:
    """Gives ``grants`` every Blob data right of the plan's storage account, each arriving
    ``propagation_s`` from now (``aliases`` maps a plan's principal id to the ``oid`` its
    tokens carry here), and the account's firewall, with ``caller`` where this machine's
    requests come from. Rights on other resources and control-plane roles grant no data."""
    account_id, inputs = account(plan, "azure-native:storage:StorageAccount", "accountName")
    for right in rights(plan):
        if right.role not in (READER, CONTRIBUTOR):
            continue
        if right.scope == account_id or account_id.startswith(right.scope + "/"):
            container = None
        elif right.scope.startswith(f"{account_id}/blobServices/default/containers/"):
            container = right.scope.rsplit("/", 1)[1]
        else:
            continue
        identity = (aliases or {}).get(right.principal, right.principal)
        grants.grant(identity, propagation_s, role=right.role, container=container)
    rules = inputs["networkRuleSet"]
    network = NetworkRules(
        default_action=rules["defaultAction"],
        ip_rules=tuple(rule["iPAddressOrRange"] for rule in rules.get("ipRules", [])),
        caller=caller,
    )
    grants.network = network
    return network


# `az` after `az login` on a laptop: `az account get-access-token` prints a token for the
# resource asked, in the signed-in user's name (the claims Entra puts in a user's token).
LAPTOP_AZ = """#!{python}
import base64, json, sys, time

args = sys.argv[1:]
if args[:2] != ["account", "get-access-token"]:
    sys.stderr.write("laptop az: only `account get-access-token` is modelled\\n")
    sys.exit(2)
resource = args[args.index("--resource") + 1] if "--resource" in args else (
    args[args.index("--scope") + 1].removesuffix("/.default"))
now = int(time.time())
claims = {{"aud": resource, "iss": "https://sts.windows.net/{tenant}/", "iat": now - 60,
    "nbf": now - 60, "exp": now + 3600, "oid": "{oid}", "sub": "{oid}", "tid": "{tenant}"}}
def part(value):
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
token = part({{"alg": "none", "typ": "JWT"}}) + "." + part(claims) + ".sig"
print(json.dumps({{"accessToken": token, "expires_on": now + 3600,
    "expiresOn": time.strftime("%Y-%m-%d %H:%M:%S.000000", time.localtime(now + 3600)),
    "tokenType": "Bearer", "subscription": "{subscription}", "tenant": "{tenant}"}}))
"""


def sign_in(monkeypatch: pytest.MonkeyPatch, bin_dir: Path, oid: str = DEPLOYER_OBJECT_ID) -> None:
    """This process authenticates as a laptop's `az login` as ``oid`` does: no AZURE_*/ARM_*
    variables (the metadata service stays closed), so DefaultAzureCredential falls through to
    the Azure CLI, whose tokens carry ``oid``. Clear ``infra.credentials.credential``'s cache
    before and after."""
    for name in [n for n in os.environ if n.startswith(("AZURE_", "ARM_"))]:
        if name != "AZURE_IMDS_URL":
            monkeypatch.delenv(name)
    laptop_az(bin_dir, sys.executable, oid)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def laptop_az(bin_dir: Path, python: str, oid: str = DEPLOYER_OBJECT_ID) -> Path:
    """Writes the laptop's `az` into ``bin_dir``, signed in as ``oid``."""
    from tests.support.fake_imds import TENANT

    bin_dir.mkdir(parents=True, exist_ok=True)
    az = bin_dir / "az"
    az.write_text(
        LAPTOP_AZ.format(python=python, oid=oid, tenant=TENANT, subscription=SUBSCRIPTION_ID)
    )
    az.chmod(az.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return az
