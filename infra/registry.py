"""Container registry: Premium ACR with the admin user and anonymous pull off.

Nodes pull with their managed identity (AcrPull); builds push with theirs (AcrPush). The network
denies by default and admits the NAT gateway's address (the nodes' egress), the configured build
machines, and trusted Azure services (ACR Tasks, once the registry opts its tasks in: see
``TaskBypass``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, UpdateResult
from pulumi_azure_native import containerregistry as acr

from infra import credentials
from infra.dynamic import OneLineError, Provider, changed_inputs
from infra.naming import Placement


@dataclass(frozen=True)
class RegistryArgs:
    placement: Placement
    registry_name: str
    allowed_ips: Sequence[pulumi.Input[str]]


class Registry(pulumi.ComponentResource):
    login_server: pulumi.Output[str]
    registry_id: pulumi.Output[str]
    # The registry's opt-in to the trusted-services bypass for ACR Tasks: whatever runs a task
    # that pushes here (the acr image build) depends on it.
    task_bypass: TaskBypass

    def __init__(
        self, name: str, args: RegistryArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:Registry", name, None, opts)
        registry = acr.Registry(
            f"{name}-acr",
            registry_name=args.registry_name,
            **args.placement.kwargs(),
            sku=acr.SkuArgs(name=acr.SkuName.PREMIUM),
            admin_user_enabled=False,
            anonymous_pull_enabled=False,
            public_network_access=acr.PublicNetworkAccess.ENABLED,
            network_rule_bypass_options=acr.NetworkRuleBypassOptions.AZURE_SERVICES,
            network_rule_set=acr.NetworkRuleSetArgs(
                default_action=acr.DefaultAction.DENY,
                ip_rules=[
                    acr.IPRuleArgs(i_p_address_or_range=ip, action=acr.Action.ALLOW)
                    for ip in args.allowed_ips
                ],
            ),
            policies=acr.PoliciesArgs(
                # ACR accepts a disabled export policy only with public network access disabled
                # (articles/container-registry/data-loss-prevention.md); nodes and build
                # machines reach this registry over its firewalled public endpoint, so exports
                # stay enabled: pulling needs AcrPull anyway.
                export_policy=acr.ExportPolicyArgs(status=acr.ExportPolicyStatus.ENABLED),
                retention_policy=acr.RetentionPolicyArgs(days=30, status=acr.PolicyStatus.ENABLED),
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.task_bypass = TaskBypass(
            f"{name}-task-bypass",
            TaskBypassArgs(
                registry_id=registry.id,
                # azure-native writes the registry with an API version that predates the
                # setting: re-apply it whenever the registry's network settings change.
                registry_network=pulumi.Output.all(
                    registry.network_rule_set,
                    registry.network_rule_bypass_options,
                    registry.public_network_access,
                ).apply(lambda network: json.dumps(network, sort_keys=True, default=str)),
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.login_server = registry.login_server
        self.registry_id = registry.id
        self.registry_name = registry.name
        self.register_outputs({"login_server": self.login_server})


# ---- the opt-in for ACR Tasks: a dynamic resource that PATCHes the registry through ARM --------
# Since 1 June 2025 ACR refuses the trusted-services bypass to a task's system-assigned identity
# (403) unless the registry sets networkRuleBypassAllowedForTasks=true (MicrosoftDocs/azure-
# management-docs, articles/container-registry/manage-network-bypass-policy-for-tasks.md, whose
# commands use api-version 2025-05-01-preview). azure-native 3.29 manages registries with
# 2023-01-01-preview and azure-mgmt-containerregistry 13.0.0 stops at 2025-03-01-preview, so
# neither has the property; the stable 2025-11-01 API has it in Registries_Update's body
# (Azure/azure-rest-api-specs, specification/containerregistry/resource-manager/
# Microsoft.ContainerRegistry/Registry/Registry.models.tsp, RegistryPropertiesUpdateParameters;
# example Registry/examples/2025-11-01/RegistryUpdate.json). The PATCH is a long-running
# operation: 200, or 201/202 with Azure-AsyncOperation or Location to poll.
# Azure SDK imports stay inside functions: Pulumi pickles the provider by reference and the
# provider process imports this module on every call.

ARM_ENDPOINT = "https://management.azure.com"
ARM_SCOPE = "https://management.azure.com/.default"
TASK_BYPASS_API_VERSION = "2025-11-01"
TASK_BYPASS_PROPERTY = "networkRuleBypassAllowedForTasks"
POLL_SECONDS = 10.0  # between status polls when ARM sends no Retry-After
PATCH_TIMEOUT_SECONDS = 900
TASK_BYPASS_OUTPUT_KEYS = ("allowed_for_tasks",)


class TaskBypassError(OneLineError):
    """The registry does not let ACR Tasks through; the message is one line naming it."""


def _registry_name(registry_id: str) -> str:
    return registry_id.rstrip("/").rsplit("/", 1)[-1]


def _fix_hint(registry_id: str) -> str:
    return (
        f"set it with `az resource update --ids {registry_id} --api-version "
        f"{TASK_BYPASS_API_VERSION} --set properties.{TASK_BYPASS_PROPERTY}=true` "
        "(needs Microsoft.ContainerRegistry/registries/write), then run pulumi up again"
    )


def arm_client() -> Any:
    """An ARM pipeline with the process's one credential (infra.credentials)."""
    # Any: ARMPipelineClient is generic over its transport's request and response types.
    from infra.azure_sdk import (
        ARMChallengeAuthenticationPolicy,
        ARMHttpLoggingPolicy,
        ARMPipelineClient,
    )
    from infra.azure_sdk import core_policies as policies

    # The policies azure-mgmt-* clients run, in their order, less proxy, tracing and hooks.
    return ARMPipelineClient(
        base_url=ARM_ENDPOINT,
        policies=[
            policies.RequestIdPolicy(),
            policies.HeadersPolicy(),
            policies.UserAgentPolicy(sdk_moniker="gpucluster"),
            policies.ContentDecodePolicy(),
            policies.RedirectPolicy(),
            policies.RetryPolicy(),
            ARMChallengeAuthenticationPolicy(credentials.credential(), ARM_SCOPE),
            policies.SensitiveHeaderCleanupPolicy(),
            ARMHttpLoggingPolicy(),
        ],
    )


def _read_allowed(client: Any, registry_id: str) -> Any:
    """The registry's ``networkRuleBypassAllowedForTasks`` as ARM reports it (None if unset)."""
    from infra.azure_sdk import ARMErrorFormat, HttpRequest
    from trainer.common.azure_sdk import HttpResponseError

    url = f"{ARM_ENDPOINT.rstrip('/')}{registry_id}"
    answer = client.send_request(
        HttpRequest("GET", url, params={"api-version": TASK_BYPASS_API_VERSION})
    )
    if answer.status_code != 200:
        raise HttpResponseError(response=answer, error_format=ARMErrorFormat)
    return (answer.json().get("properties") or {}).get(TASK_BYPASS_PROPERTY)


def enable_task_bypass(registry_id: str) -> bool:
    """PATCH ``networkRuleBypassAllowedForTasks: true`` onto the registry, wait for ARM to
    finish, read the setting back; anything but ``true`` raises ``TaskBypassError``."""
    from infra.azure_sdk import ARMErrorFormat, ARMPolling, HttpRequest, LROPoller
    from trainer.common.azure_sdk import HttpResponseError

    name = _registry_name(registry_id)
    url = f"{ARM_ENDPOINT.rstrip('/')}{registry_id}"
    params = {"api-version": TASK_BYPASS_API_VERSION}
    client = arm_client()
    patch = HttpRequest(
        "PATCH", url, params=params, json={"properties": {TASK_BYPASS_PROPERTY: True}}
    )
    try:
        # The pipeline response (not send_request's bare one) is what LROPoller polls from,
        # as the generated clients' begin_update does.
        initial = client._pipeline.run(patch)
        if initial.http_response.status_code not in (200, 201, 202):
            raise HttpResponseError(response=initial.http_response, error_format=ARMErrorFormat)
        poller = LROPoller(
            client,
            initial,
            lambda _response: None,
            ARMPolling(POLL_SECONDS, lro_options={"final-state-via": "azure-async-operation"}),
        )
        poller.wait(PATCH_TIMEOUT_SECONDS)  # raises what polling met (a failed operation)
        if not poller.done():
            raise TaskBypassError(
                f"registry {name}: the update that sets {TASK_BYPASS_PROPERTY} is still "
                f"{poller.status()} after {PATCH_TIMEOUT_SECONDS} s; {_fix_hint(registry_id)}"
            )
        allowed = _read_allowed(client, registry_id)
    except HttpResponseError as err:
        raise TaskBypassError(
            f"could not set {TASK_BYPASS_PROPERTY} on registry {name}: {err.message}; "
            f"{_fix_hint(registry_id)}"
        ) from None
    if allowed is not True:
        raise TaskBypassError(
            f"registry {name} reports {TASK_BYPASS_PROPERTY}={json.dumps(allowed)} after the "
            f"update (api-version {TASK_BYPASS_API_VERSION}), so ACR Tasks' pushes through its "
            f"network rules would be refused with 403; {_fix_hint(registry_id)}"
        )
    return True


def ensure_task_bypass(registry_id: str) -> None:
    """Before a task runs: the setting as the registry has it now, set again if it is off. The
    ``TaskBypass`` resource sets it only when the registry's network settings change, and an
    owner can turn it off since (portal, ``az``); the run would then fail at its push with 403
    (articles/container-registry/manage-network-bypass-policy-for-tasks.md)."""
    from trainer.common.azure_sdk import HttpResponseError

    name = _registry_name(registry_id)
    try:
        allowed = _read_allowed(arm_client(), registry_id)
    except HttpResponseError as err:
        raise TaskBypassError(
            f"could not read {TASK_BYPASS_PROPERTY} of registry {name}: {err.message}; "
            "the deployer needs read access to the registry (e.g. Reader), then run pulumi up "
            "again"
        ) from None
    if allowed is True:
        return
    pulumi.log.warn(
        f"registry {name} has {TASK_BYPASS_PROPERTY}={json.dumps(allowed)} (turned off since "
        "the stack set it?): setting it again before the image build"
    )
    enable_task_bypass(registry_id)


class TaskBypassProvider(Provider):
    """Opts the registry's tasks into the trusted-services bypass on create and update. Keep
    this class's name and module: stacks refer to them."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        allowed = enable_task_bypass(props["registry_id"])
        return CreateResult(props["registry_id"], {**props, "allowed_for_tasks": allowed})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = changed_inputs(olds, news, TASK_BYPASS_OUTPUT_KEYS)
        # Another registry is another resource; new network settings only re-apply the PATCH.
        replaces = [key for key in changed if key == "registry_id"]
        return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        allowed = enable_task_bypass(news["registry_id"])
        return UpdateResult({**news, "allowed_for_tasks": allowed})

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # Nothing to undo: a destroyed stack takes the registry with it, and a registry that
        # outlives this resource keeps a setting that only admits its own tasks.
        return None


@dataclass(frozen=True)
class TaskBypassArgs:
    registry_id: pulumi.Input[str]
    # The registry's network settings as azure-native last wrote them (a change re-applies).
    registry_network: pulumi.Input[str]


class TaskBypass(pulumi.dynamic.Resource, module="acr", name="TaskBypass"):
    """``networkRuleBypassAllowedForTasks: true`` on one registry."""

    allowed_for_tasks: pulumi.Output[bool]

    def __init__(
        self, name: str, args: TaskBypassArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props: dict[str, Any] = {
            "registry_id": args.registry_id,
            "registry_network": args.registry_network,
        }
        props.update({key: None for key in TASK_BYPASS_OUTPUT_KEYS})
        super().__init__(TaskBypassProvider(), name, props, opts)
