"""Pulumi mocks that stand in for Azure: they record every resource the program declares and
answer with plausible computed outputs (endpoints, principal ids). Used by the offline plan and
the tests; no credentials, CLI or provider plugin needed."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pulumi

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
}


@dataclass(frozen=True)
class DeclaredResource:
    typ: str
    name: str
    inputs: dict[str, Any]
    custom: bool
    protect: bool = False


class AzureMocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[DeclaredResource] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        inputs = dict(args.inputs)
        self.resources.append(DeclaredResource(args.typ, args.name, inputs, bool(args.custom)))
        azure_name = self._azure_name(args.typ, args.name, inputs)
        state: dict[str, Any] = {**inputs, "name": azure_name}
        identity = inputs.get("identity")
        if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
            # azure-native v3 takes a list of ids and returns a map keyed by id.
            state["identity"] = {
                **identity,
                "userAssignedIdentities": {i: {} for i in identity["userAssignedIdentities"]},
            }
        state.update(self._computed(args.typ, azure_name, inputs))
        resource_id = (
            f"/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/mock/providers/"
            f"{args.typ.split(':')[1]}/{azure_name}"
        )
        return resource_id, state

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
        if typ == "azure-native:containerregistry:TaskRun":
            request = inputs["runRequest"]
            return {
                "runResult": {
                    "runId": "ca1",
                    "status": "Succeeded",
                    "outputImages": [{"digest": _fake_digest(request["imageNames"][0])}],
                }
            }
        if typ == "docker-build:index:Image":
            return {"digest": _fake_digest(str(inputs.get("tags")))}
        if typ == "pulumi-python:dynamic:Resource" and "trainer_args" in inputs:
            from infra.job import JobSpec, _outputs

            return _outputs(JobSpec.from_props(inputs), "active")
        if typ == "azure-native:network:PublicIPAddress":
            return {"ipAddress": "203.0.113.10"}  # documentation range (RFC 5737)
        return {}


def _fake_digest(seed: str) -> str:
    return "sha256:" + hashlib.sha256(seed.encode()).hexdigest()
