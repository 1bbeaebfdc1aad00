"""Previous blob versions expire: the data account keeps every overwritten or deleted blob as a
previous version (versioning is on), so without a lifecycle policy each checkpoint the mirror
prunes and each live file re-uploaded every few minutes is billed forever. The program declares
one policy whose rules delete previous versions after the stack's days, checked here against
the rules Azure documents for a policy (read 2026-11-28):

- articles/storage/blobs/lifecycle-management-policy-structure.md: the policy is named
  ``default``; 1 to 100 rules; a rule name is up to 256 alphanumeric characters, unique; type
  ``Lifecycle``; ``prefixMatch`` holds up to 10 prefixes, each starting with a container name.
- articles/storage/blobs/lifecycle-management-policy-delete.md: previous versions are the
  ``version`` element, aged by their creation time (``daysAfterCreationGreaterThan``), for
  ``blockBlob``; a deleted version goes to soft delete for its retention first.
"""

from __future__ import annotations

import re

import pytest

from dt_commands.plan import evaluate, render
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from infra.settings.values import load_schema
from infra.storage import CONTAINERS
from tests.support.stacks import one, stack_values

POLICY = "azure-native:storage:ManagementPolicy"
RULE_NAME = re.compile(r"[A-Za-z0-9]{1,256}")


def documented_rule_violations(policy: dict) -> list[str]:
    """What in ``policy`` (the resource's inputs) Azure's policy structure refuses."""
    wrong = []
    if policy.get("managementPolicyName") != "default":
        wrong.append("the policy's name must be 'default'")
    rules = policy["policy"]["rules"]
    if not 1 <= len(rules) <= 100:
        wrong.append(f"{len(rules)} rules: 1 to 100")
    names = [rule["name"] for rule in rules]
    if len(set(names)) != len(names):
        wrong.append(f"rule names repeat: {names}")
    for rule in rules:
        if not RULE_NAME.fullmatch(rule["name"]):
            wrong.append(f"rule name {rule['name']!r}: up to 256 letters and digits")
        if rule["type"] != "Lifecycle":
            wrong.append(f"{rule['name']}: type {rule['type']!r}")
        filters = rule["definition"].get("filters") or {}
        prefixes = filters.get("prefixMatch") or []
        if len(prefixes) > 10:
            wrong.append(f"{rule['name']}: {len(prefixes)} prefixes, at most 10")
        for prefix in prefixes:
            if prefix.split("/")[0] not in CONTAINERS:
                wrong.append(f"{rule['name']}: prefix {prefix!r} starts with no container")
        if filters.get("blobTypes") != ["blockBlob"]:
            wrong.append(f"{rule['name']}: blobTypes {filters.get('blobTypes')}")
        version = rule["definition"]["actions"].get("version") or {}
        days = (version.get("delete") or {}).get("daysAfterCreationGreaterThan")
        # Pulumi sends every number as a double; Azure takes a whole number of days.
        if not isinstance(days, int | float) or days < 0 or not float(days).is_integer():
            wrong.append(f"{rule['name']}: previous versions' delete needs whole days >= 0")
    return wrong


def _expiry(plan) -> dict[str, int]:
    """prefix -> days after which its previous versions are deleted."""
    policy = one(plan, POLICY).inputs
    assert documented_rule_violations(policy) == []
    expiry = {}
    for rule in policy["policy"]["rules"]:
        days = rule["definition"]["actions"]["version"]["delete"]["daysAfterCreationGreaterThan"]
        for prefix in rule["definition"]["filters"]["prefixMatch"]:
            assert prefix not in expiry, f"{prefix} in two rules"
            expiry[prefix] = int(days)
    return expiry


def test_every_containers_previous_versions_expire_by_a_documented_rule(plan):
    expiry = _expiry(plan)
    assert sorted(expiry) == sorted(f"{c}/" for c in CONTAINERS)
    assert expiry["checkpoints/"] == 1  # checkpointVersionDays' default: pruned checkpoints
    assert {d for p, d in expiry.items() if p != "checkpoints/"} == {7}  # blobVersionDays
    policy = one(plan, POLICY)
    account = one(plan, "azure-native:storage:StorageAccount", "-account")
    assert policy.inputs["accountName"] == account.inputs["accountName"]
    assert not policy.inputs["policy"]["rules"][0]["definition"]["actions"].get("baseBlob")


def test_the_stacks_days_reach_the_rules():
    values = {**stack_values("dev"), "gpu-cluster:blobVersionDays": 30}
    values["gpu-cluster:checkpointVersionDays"] = 0
    expiry = _expiry(evaluate("dev", values))
    assert expiry["checkpoints/"] == 0 and expiry["logs/"] == 30


@pytest.mark.parametrize(
    ("key", "value"), [("blobVersionDays", -1), ("checkpointVersionDays", 100000)]
)
def test_days_outside_what_azure_takes_are_one_line(key, value):
    values = {**stack_values("dev"), f"gpu-cluster:{key}": value}
    with pytest.raises(ConfigError) as refused:
        StackSettings.from_mapping("dev", values, load_schema())
    assert str(refused.value).startswith(f"{key}={value}:"), refused.value


def test_a_policy_that_breaks_the_documented_rules_is_caught():
    """The checker itself: the shapes Azure refuses are named."""
    bad = {
        "managementPolicyName": "mine",
        "policy": {
            "rules": [
                {
                    "name": "old-versions",
                    "type": "Lifecycle",
                    "definition": {
                        "filters": {"prefixMatch": ["nocontainer/x"], "blobTypes": ["appendBlob"]},
                        "actions": {"version": {"delete": {"daysAfterCreationGreaterThan": -1}}},
                    },
                }
            ]
        },
    }
    wrong = documented_rule_violations(bad)
    assert len(wrong) == 5, wrong


def test_the_plan_says_how_long_previous_versions_are_billed(dev_plan):
    text = render(dev_plan, busy_hours=160)
    lines = text.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("Blob versions")))
    assert lines[at : at + 3] == [
        "Blob versions (blobVersionDays, checkpointVersionDays): a blob overwritten or deleted "
        "stays billed as a previous version 7 days (checkpoints 1 day)",
        "  then 7 days soft-deleted: a checkpoint the mirror prunes is billed up to 9 days "
        "longer (the policy runs once a day)",
        "  checkpoint storage at steady state: the kept checkpoints, plus those the mirror "
        "pruned in the last 9 days",
    ]
    assert "storage usage and logs not included" in text
