"""Names and tags. Every name carries team and stack so stacks never collide.

A table of facts: it imports no setting, component or tool (ARCHITECTURE.md); a function that
needs a setting takes its value, and ``infra.settings`` checks the settings against these rules."""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

# The Pulumi project (Pulumi.yaml's name): the namespace of the stack's config keys, and part of
# every tag set and global name.
PROJECT = "gpu-cluster"

# The tags every taggable resource carries (checked by the tests and the policy pack), and the
# resource types this program declares that accept tags.
REQUIRED_TAGS = ("project", "team", "stack", "cost-center")
TAGGABLE = frozenset(
    {
        "azure-native:resources:ResourceGroup",
        "azure-native:network:VirtualNetwork",
        "azure-native:network:NetworkSecurityGroup",
        "azure-native:network:NatGateway",
        "azure-native:network:PublicIPAddress",
        "azure-native:network:NetworkInterface",
        "azure-native:storage:StorageAccount",
        "azure-native:containerregistry:Registry",
        "azure-native:managedidentity:UserAssignedIdentity",
        "azure-native:compute:Disk",
        "azure-native:compute:VirtualMachine",
        "azure-native:batch:BatchAccount",
        "azure-native:operationalinsights:Workspace",
    }
)

# Azure's tag limits ("Use tags to organize your Azure resources and management hierarchy",
# articles/azure-resource-manager/management/tag-resources.md, Limitations): "The tag name has a
# limit of 512 characters and the tag value has a limit of 256 characters. For storage accounts,
# the tag name has a limit of 128 characters"; "Tag names can't contain these characters: <, >,
# %, &, \, ?, /". Every resource carries the same tags, storage accounts included, so names are
# held to 128. ARM would refuse a longer tag mid-deployment, after other resources exist.
TAG_NAME_MAX = 128
TAG_VALUE_MAX = 256
TAG_NAME_FORBIDDEN = frozenset("<>%&\\?/")


def tag_problem(tags: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first tag Azure would refuse, as (name, why: starting ``=<value>: ``, ending with
    the fix); None when all are accepted. Used by ``StackSettings`` and the policy pack."""
    for name, value in tags.items():
        name, text = str(name), str(value)
        shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"
        if not name or len(name) > TAG_NAME_MAX:
            return name, (
                f"={shown}: the tag name {name[:40]!r} has {len(name)} characters; Azure takes "
                f"1..{TAG_NAME_MAX} (storage accounts); use a shorter name"
            )
        bad = sorted(TAG_NAME_FORBIDDEN & set(name))
        if bad:
            return name, (
                f"={shown}: the tag name {name!r} contains {' '.join(bad)}, which Azure refuses "
                "in tag names (< > % & \\ ? /); rename it"
            )
        if not isinstance(value, str):
            return name, f"={shown}: a tag value is a string"
        if len(text) > TAG_VALUE_MAX:
            return name, (
                f"={shown}: Azure takes tag values of at most {TAG_VALUE_MAX} characters; "
                "use a shorter value"
            )
    return None


# A fixed namespace so role-assignment names are the same on every `pulumi up` (idempotent).
_ROLE_NAMESPACE = uuid.UUID("0b9e3c2e-4a61-4d8e-9a55-6f7d2d1c5e10")


def default_tags(*, team: str, stack: str, cost_center: str) -> dict[str, str]:
    return {
        "project": PROJECT,
        "team": team,
        "stack": stack,
        "cost-center": cost_center,
        "managed-by": "pulumi",
    }


def prefix(*, team: str, stack: str) -> str:
    """``<team>-<stack>``, the stem of every resource name (``vision-prod``, not
    ``vision-vision-prod``, for stacks already named ``<team>-<env>``)."""
    stack = re.sub(r"[^a-z0-9-]", "-", stack.lower()).strip("-")
    return stack if stack.startswith(f"{team}-") else f"{team}-{stack}"


def global_name(*, team: str, stack: str, role: str, max_length: int = 24) -> str:
    """A globally unique lowercase alphanumeric name (storage accounts, registries, Batch).

    3-24 lowercase letters and digits: team + role + an 8-character hash of project/team/stack,
    so two stacks never collide and the name never changes between runs.
    """
    digest = hashlib.sha256(f"{PROJECT}/{team}/{stack}".encode()).hexdigest()
    stem = re.sub(r"[^a-z0-9]", "", f"{team}{role}")[: max_length - 8]
    return f"{stem}{digest[:8]}"


# An AzureML workspace's name: 3-33 letters, digits, hyphens and underscores, from a letter or
# digit (Azure's rule for Microsoft.MachineLearningServices/workspaces).
WORKSPACE_NAME_MAX = 33


def workspace_name(stem: str) -> str:
    """The stack's AzureML workspace: ``mlw-<stem>``, cut to Azure's length."""
    return f"mlw-{stem}"[:WORKSPACE_NAME_MAX].rstrip("-")


# An AzureML compute's name: 3-24 letters, digits and '-', from a letter, unique among the
# computes of its region (how-to-create-attach-compute-cluster.md, read 2026-11-29): the
# stack's hash makes it so.
COMPUTE_NAME_MAX = 24


def compute_name(*, team: str, stack: str) -> str:
    """The AzureML backend's compute cluster: team, "gpu" and the stack's hash (``global_name``,
    whose rule fits a compute's)."""
    return global_name(team=team, stack=stack, role="gpu", max_length=COMPUTE_NAME_MAX)


def role_assignment_name(*parts: str) -> str:
    """A deterministic GUID for a role assignment from its scope, principal and role."""
    return str(uuid.uuid5(_ROLE_NAMESPACE, "/".join(parts)))


@dataclass(frozen=True)
class Placement:
    """Where a component's resources go: resource group, region and tags (shared by all)."""

    resource_group_name: pulumi.Input[str]
    location: str
    tags: Mapping[str, str]

    def tag_map(self) -> dict[str, str]:
        return dict(self.tags)

    def kwargs(self) -> dict[str, Any]:
        """``resource_group_name``, ``location`` and ``tags`` for a resource that takes all
        three: ``network.NatGateway(name, ..., **placement.kwargs())``."""
        return {
            "resource_group_name": self.resource_group_name,
            "location": self.location,
            "tags": self.tag_map(),
        }
