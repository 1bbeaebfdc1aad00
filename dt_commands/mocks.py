"""Pulumi mocks that stand in for Azure: they record every resource the program declares and
answer with plausible computed outputs (endpoints, principal ids). Used by the offline plan and
the tests; no credentials, CLI or provider plugin needed."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.rpc import UNKNOWN

SUBSCRIPTION_ID = "00000000-0000-0000-0000-000000000000"
TENANT_ID = "11111111-1111-1111-1111-111111111111"
DEPLOYER_OBJECT_ID = "22222222-2222-2222-2222-222222222222"

# The input that carries each resource's Azure name; others are auto-named from the logical name.
_NAME_INPUT = {
    "azure-native:resources:ResourceGroup": "resourceGroupName",
    "azure-native:storage:StorageAccount": "accountName",
    "azure-native:containerregistry:Registry": "registryName",
    "azure-native:batch:BatchAccount": "accountName",
    "azure-native:batch:Pool": "poolName",
    "azure-native:storage:BlobContainer": "containerName",
    "azure-native:storage:FileShare": "shareName",
    "azure-native:machinelearningservices:Workspace": "workspaceName",
    "azure-native:keyvault:Vault": "vaultName",
    "azure-native:privatedns:PrivateZone": "privateZoneName",
    "azure-native:authorization:RoleDefinition": "roleDefinitionId",
}
# Where a custom role may be assignable: "a management group, subscription or resource group"
# (azure-docs articles/role-based-access-control/custom-roles.md, AssignableScopes; read
# 2026-11-29). ARM refuses a role definition whose assignable scope is one resource.
_ASSIGNABLE_SCOPE = re.compile(
    r"^/(providers/Microsoft\.Management/managementGroups/[^/]+|subscriptions/[^/]+"
    r"(/resourceGroups/[^/]+)?)$",
    re.IGNORECASE,
)


class AzureRefusal(Exception):
    """What ARM answers to a resource it does not accept (the engine fails the update)."""


@dataclass(frozen=True)
class DeclaredResource:
    typ: str
    name: str
    inputs: dict[str, Any]
    custom: bool
    protect: bool = False


class AzureMocks(pulumi.runtime.Mocks):
    """``preview=True`` answers as the engine does in a preview: only the inputs are known, every
    computed output (ids, endpoints, principal ids, digests) is unknown."""

    def __init__(self, preview: bool = False) -> None:
        self.resources: list[DeclaredResource] = []
        self.preview = preview

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        inputs = dict(args.inputs)
        _refuse_what_azure_refuses(args.typ, inputs)
        self.resources.append(DeclaredResource(args.typ, args.name, inputs, bool(args.custom)))
        identity = inputs.get("identity")
        if isinstance(identity, dict):
            identity = {**identity}
            ids = identity.get("userAssignedIdentities")
            if isinstance(ids, list):
                # azure-native v3 takes a list of ids and returns a map keyed by id (unknown as
                # a whole while an id is: a preview does not know new identities' ids).
                known = all(isinstance(i, str) for i in ids)
                identity["userAssignedIdentities"] = {i: {} for i in ids} if known else UNKNOWN
            if self.preview:
                # A system-assigned identity's principal exists only after creation.
                identity |= {"principalId": UNKNOWN, "tenantId": UNKNOWN}
        if self.preview:
            return None, inputs if identity is None else {**inputs, "identity": identity}
        azure_name = self._azure_name(args.typ, args.name, inputs)
        state: dict[str, Any] = {**inputs, "name": azure_name}
        if identity is not None:
            state["identity"] = identity
        state.update(self._computed(args.typ, azure_name, inputs))
        return mock_resource_id(args.typ, azure_name), state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list]:
        if args.token == "azure-native:authorization:getClientConfig":
            return {
                "subscriptionId": SUBSCRIPTION_ID,
                "tenantId": TENANT_ID,
                "objectId": DEPLOYER_OBJECT_ID,
                "clientId": DEPLOYER_OBJECT_ID,
            }, []
        return {}, []

    @staticmethod
    def _azure_name(typ: str, logical: str, inputs: dict[str, Any]) -> str:
        key = _NAME_INPUT.get(typ)
        return str(inputs[key]) if key and inputs.get(key) else logical

    @staticmethod
    def _computed(typ: str, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
        location = inputs.get("location", "eastus")
        if typ == "azure-native:storage:StorageAccount":
            return {
                "primaryEndpoints": {
                    "blob": f"https://{name}.blob.core.windows.net/",
                    "file": f"https://{name}.file.core.windows.net/",
                }
            }
        if typ == "azure-native:containerregistry:Registry":
            return {"loginServer": f"{name}.azurecr.io"}
        if typ == "azure-native:batch:BatchAccount":
            return {"accountEndpoint": f"{name}.{location}.batch.azure.com"}
        if typ == "azure-native:managedidentity:UserAssignedIdentity":
            return {
                "principalId": f"principal-{name}",
                "clientId": f"client-{name}",
                "tenantId": TENANT_ID,
            }
        if typ == "azure-native:containerregistry:Task":
            # The system-assigned identity Azure creates with the task.
            identity = {**inputs.get("identity", {}), "principalId": f"principal-{name}"}
            return {"identity": {**identity, "tenantId": TENANT_ID}}
        if typ == "pulumi-python:dynamic/acr:TaskBypass":
            return {"allowed_for_tasks": True}  # what the provider reads back after its PATCH
        if typ == "pulumi-python:dynamic/acr:RegistryPullRole":
            # A registry's default mode; `pulumi up` reads the real one (infra.registry_mode).
            from infra.registry_mode import LEGACY, PULL_ROLES

            return {"mode": LEGACY, "role": PULL_ROLES[LEGACY]}
        if typ == "pulumi-python:dynamic/acr:ImageBuild":
            # What infra.image_build.run_build returns once the run pushed the image.
            return {"run_id": "ca1", "status": "Succeeded", "digest": _fake_digest(inputs["image"])}
        if typ == "docker-build:index:Image":
            return {"digest": _fake_digest(str(inputs.get("tags")))}
        if typ == "pulumi-python:dynamic:Resource" and "trainer_args" in inputs:
            from infra.job_outputs import job_outputs
            from infra.job_spec import JobSpec

            return job_outputs(JobSpec.from_props(inputs), "active")
        if typ == "azure-native:network:PublicIPAddress":
            return {"ipAddress": "203.0.113.10"}  # documentation range (RFC 5737)
        if typ == "azure-native:machinelearningservices:Workspace":
            # properties.mlFlowTrackingUri, as how-to-use-mlflow-configure-tracking.md shows it.
            return {
                "mlFlowTrackingUri": f"azureml://{location}.api.azureml.ms/mlflow/v1.0/"
                f"subscriptions/{SUBSCRIPTION_ID}/resourceGroups/{inputs['resourceGroupName']}/"
                f"providers/Microsoft.MachineLearningServices/workspaces/{name}"
            }
        return {}


def mock_resource_id(typ: str, azure_name: str) -> str:
    """An id of ARM's shape for resource groups (a scope some checks read); the rest under a
    mock group, by the provider module's name."""
    if typ == "azure-native:resources:ResourceGroup":
        return f"/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/{azure_name}"
    return (
        f"/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/mock/providers/"
        f"{typ.split(':')[1]}/{azure_name}"
    )


def _refuse_what_azure_refuses(typ: str, inputs: dict[str, Any]) -> None:
    if typ == "azure-native:authorization:RoleDefinition":
        for scope in inputs.get("assignableScopes") or ():
            if isinstance(scope, str) and not _ASSIGNABLE_SCOPE.match(scope):
                raise AzureRefusal(
                    f"role definition {inputs.get('roleName')!r}: assignable scope {scope} is "
                    "not a management group, subscription or resource group"
                )


class RecordingMonitor(MockMonitor):
    """The mock monitor, also recording what the engine orders creation by: each resource's
    dependencies as the SDK sends them in RegisterResource (explicit ``depends_on`` and every
    resource whose outputs flow into its inputs), by resource name."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.dependencies: dict[str, set[str]] = {}
        # By the mocks' URN (names repeat: a component and its children share the stem).
        self.registered: dict[str, Registration] = {}

    def RegisterResource(self, request):
        urns = set(request.dependencies)
        for dependencies in request.propertyDependencies.values():
            urns |= set(dependencies.urns)
        self.dependencies[request.name] = {urn.rsplit("::", 1)[-1] for urn in urns}
        response = super().RegisterResource(request)
        self.registered[response.urn] = Registration(
            request.type, request.name, request.parent, frozenset(urns), request.retainOnDelete
        )
        return response


@dataclass(frozen=True)
class Registration:
    """One RegisterResource as the engine receives it; URNs are the mocks' own."""

    typ: str
    name: str
    parent: str  # the parent's URN ("" for the root stack)
    dependencies: frozenset[str]  # explicit depends_on and every resource its inputs read
    retain_on_delete: bool = False  # left in Azure when Pulumi deletes it


def _fake_digest(seed: str) -> str:
    return "sha256:" + hashlib.sha256(seed.encode()).hexdigest()
