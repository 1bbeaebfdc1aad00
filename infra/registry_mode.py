"""Which role lets the nodes pull from a registry the stack does not own (``imageRef``): a
registry in the "RBAC Registry + ABAC Repository Permissions" mode does not honour AcrPull
("the AcrPull, AcrPush, and AcrDelete roles aren't honored in an ABAC-enabled registry";
azure-management-docs articles/container-registry/container-registry-rbac-abac-repository-
permissions.md, read 2026-11-28): there the nodes get Container Registry Repository Reader.

The mode is ``properties.roleAssignmentMode`` (``LegacyRegistryPermissions``, the default, or
``AbacRepositoryPermissions``; Azure/azure-rest-api-specs Registry.models.tsp, stable in
2025-11-01). azure-native 3.29 reads registries at an API without it, so ``RegistryPullRole``,
a dynamic resource, reads it through ARM at `pulumi up` and on refresh: a preview shows the
role as unknown. Azure SDK imports stay inside functions (the provider is pickled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult

from infra import registry
from infra.dynamic import OneLineError, Provider, changed_inputs
from infra.identity import ACR_PULL, REPOSITORY_READER

MODE_API_VERSION = "2025-11-01"
MODE_PROPERTY = "roleAssignmentMode"
LEGACY = "LegacyRegistryPermissions"  # the API's default when a registry sets none
ABAC = "AbacRepositoryPermissions"
PULL_ROLES = {LEGACY: ACR_PULL, ABAC: REPOSITORY_READER}
OUTPUT_KEYS = ("mode", "role")


class RegistryModeError(OneLineError):
    """The registry's mode could not be read or is not one this program knows; one line."""


def read_mode(registry_id: str) -> str:
    """The registry's ``roleAssignmentMode`` as ARM reports it now (absent: the default)."""
    from infra.azure_sdk import ARMErrorFormat, HttpRequest
    from trainer.common.azure_sdk import HttpResponseError

    url = f"{registry.ARM_ENDPOINT.rstrip('/')}{registry_id}"
    try:
        answer = registry.arm_client().send_request(
            HttpRequest("GET", url, params={"api-version": MODE_API_VERSION})
        )
        if answer.status_code != 200:
            raise HttpResponseError(response=answer, error_format=ARMErrorFormat)
    except HttpResponseError as err:
        first = (str(err.message or err).strip().splitlines() or ["no message"])[0]
        raise RegistryModeError(
            f"imageRegistryId={registry_id}: could not read the registry's {MODE_PROPERTY} "
            f"({err.status_code}: {first}); the deployer needs read access to it (Reader), "
            "which decides the role the nodes pull with, then run pulumi up again"
        ) from None
    mode = (answer.json().get("properties") or {}).get(MODE_PROPERTY) or LEGACY
    if mode not in PULL_ROLES:
        raise RegistryModeError(
            f"imageRegistryId={registry_id}: {MODE_PROPERTY}={mode!r}, a mode this program "
            f"does not know (it grants pulls in {' and '.join(PULL_ROLES)}); copy the image "
            "into a registry in one of those, or this stack's own (unset imageRef)"
        )
    return mode


def _outputs(registry_id: str) -> dict[str, str]:
    mode = read_mode(registry_id)
    return {"mode": mode, "role": PULL_ROLES[mode]}


class RegistryPullRoleProvider(Provider):
    """Reads the mode on create and refresh; another registry is another resource. Keep this
    class's name and module: stacks refer to them."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(props["registry_id"], {**props, **_outputs(props["registry_id"])})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_, {**props, **_outputs(props["registry_id"])})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = changed_inputs(olds, news, OUTPUT_KEYS)
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=False)


@dataclass(frozen=True)
class RegistryPullRoleArgs:
    registry_id: str


class RegistryPullRole(pulumi.dynamic.Resource, module="acr", name="RegistryPullRole"):
    """``role``: the built-in role's GUID the nodes pull from ``registry_id`` with."""

    mode: pulumi.Output[str]
    role: pulumi.Output[str]

    def __init__(
        self, name: str, args: RegistryPullRoleArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props = {"registry_id": args.registry_id, **{key: None for key in OUTPUT_KEYS}}
        super().__init__(RegistryPullRoleProvider(), name, props, opts)
