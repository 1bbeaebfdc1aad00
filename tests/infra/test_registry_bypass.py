"""The TaskBypass dynamic provider: its create PATCHes the registry through azure-core's ARM
pipeline against a fake ARM endpoint (HTTPS on 127.0.0.1 with a self-signed certificate trusted
through REQUESTS_CA_BUNDLE), which records what is sent and answers like ACR's Registries_Update
(200 at once, or 202 with a status monitor to poll); and the Registry component declares it."""

import base64
import json
import subprocess
import sys

import dill
import pulumi
import pytest

from dt_commands.mocks import AzureMocks
from infra import registry as registry_module
from infra.naming import Placement
from infra.registry import (
    TASK_BYPASS_API_VERSION,
    TaskBypassError,
    TaskBypassProvider,
)
from tests.infra.fake_arm import (
    BYPASS_API_VERSION,
    BYPASS_PATCH,
    BYPASS_PROPERTY,
    OPERATION,
    REGISTRY_ID,
    FakeRegistry,
    serving_arm,
)
from tests.support.stacks import REPO

PROPERTY = BYPASS_PROPERTY
PATCH_BODY = BYPASS_PATCH
NETWORK = json.dumps([{"defaultAction": "Deny"}, "AzureServices", "Enabled"])


def test_the_fake_speaks_the_api_version_the_provider_uses():
    assert BYPASS_API_VERSION == TASK_BYPASS_API_VERSION


def _props(registry_id=REGISTRY_ID, network=NETWORK):
    return {"registry_id": registry_id, "registry_network": network, "allowed_for_tasks": None}


@pytest.fixture
def arm(tmp_path, monkeypatch):
    fake = FakeRegistry()
    with serving_arm(tmp_path, monkeypatch, fake.handle) as base:
        fake.base = base
        monkeypatch.setattr(registry_module, "ARM_ENDPOINT", base)
        monkeypatch.setattr(registry_module, "POLL_SECONDS", 0)
        yield fake


def _assert_patch(request, registry_id=REGISTRY_ID):
    assert (request["method"], request["path"]) == ("PATCH", registry_id)
    assert request["query"] == {"api-version": [TASK_BYPASS_API_VERSION]}
    assert request["body"] == PATCH_BODY
    assert request["headers"]["Authorization"] == "Bearer fake-arm-token"
    assert request["headers"]["Content-Type"].startswith("application/json")


def _calls(arm):
    return [(r["method"], r["path"]) for r in arm.requests]


def test_create_patches_the_registry_and_reads_the_setting_back(arm):
    result = TaskBypassProvider().create(_props())
    assert result.id == REGISTRY_ID
    assert result.outs == {**_props(), "allowed_for_tasks": True}
    patch, read = arm.requests
    _assert_patch(patch)
    assert (read["method"], read["path"]) == ("GET", REGISTRY_ID)
    assert read["query"] == {"api-version": [TASK_BYPASS_API_VERSION]}
    assert read["headers"]["Authorization"] == "Bearer fake-arm-token"


@pytest.mark.parametrize("mode", ["azure-async-operation", "location"])
def test_an_accepted_update_is_polled_until_it_ends(arm, mode):
    arm.mode = mode
    result = TaskBypassProvider().create(_props())
    assert result.outs["allowed_for_tasks"] is True
    _assert_patch(arm.requests[0])
    polls = [("GET", OPERATION)] * 2
    # An Azure-AsyncOperation monitor is followed by a GET of the resource (final-state-via).
    final = [("GET", REGISTRY_ID)] if mode == "azure-async-operation" else []
    assert _calls(arm) == [("PATCH", REGISTRY_ID), *polls, *final, ("GET", REGISTRY_ID)]
    assert all(r["headers"]["Authorization"] == "Bearer fake-arm-token" for r in arm.requests)


def test_a_registry_still_saying_false_is_one_line_naming_it_and_the_fix(arm):
    arm.honours = False  # the update succeeds, the setting stays false
    with pytest.raises(TaskBypassError) as failed:
        TaskBypassProvider().create(_props())
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"registry teamacr reports {PROPERTY}=false after the update")
    assert "403" in message
    assert (
        f"az resource update --ids {REGISTRY_ID} --api-version {TASK_BYPASS_API_VERSION} "
        f"--set properties.{PROPERTY}=true"
    ) in message
    _assert_patch(arm.requests[0])
    assert _calls(arm) == [("PATCH", REGISTRY_ID), ("GET", REGISTRY_ID)]


def test_a_refused_update_names_the_registry(arm):
    arm.refuse = (403, {"error": {"code": "AuthorizationFailed", "message": "no\nwrite access"}})
    with pytest.raises(TaskBypassError) as failed:
        TaskBypassProvider().create(_props())
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"could not set {PROPERTY} on registry teamacr: ")
    assert "AuthorizationFailed" in message and "az resource update --ids" in message
    _assert_patch(arm.requests[0])
    assert len(arm.requests) == 1  # nothing polled, nothing read


def test_a_failed_update_operation_is_an_error(arm):
    arm.mode, arm.outcome = "azure-async-operation", "Failed"
    with pytest.raises(TaskBypassError, match=f"could not set {PROPERTY} on registry teamacr"):
        TaskBypassProvider().create(_props())
    _assert_patch(arm.requests[0])
    assert ("GET", OPERATION) in _calls(arm)


def test_only_a_new_registry_or_new_network_settings_reapply_and_delete_sends_nothing(arm):
    provider = TaskBypassProvider()
    olds = {**_props(), "allowed_for_tasks": True, "__provider": "old code"}
    news = {**_props(), "__provider": "new code"}
    assert provider.diff(REGISTRY_ID, olds, news).changes is False  # provider code, outputs
    moved = provider.diff(REGISTRY_ID, olds, {**news, "registry_id": REGISTRY_ID + "2"})
    assert moved.changes is True and moved.replaces == ["registry_id"]
    renet = {**news, "registry_network": json.dumps([{"defaultAction": "Deny"}, "None", "Enabled"])}
    rediff = provider.diff(REGISTRY_ID, olds, renet)
    assert rediff.changes is True and not rediff.replaces
    provider.delete(REGISTRY_ID, olds)
    assert arm.requests == []
    updated = provider.update(REGISTRY_ID, olds, renet)
    assert updated.outs == {**renet, "allowed_for_tasks": True}
    _assert_patch(arm.requests[0])


def test_importing_the_provider_module_loads_no_azure_sdk():
    code = (
        "import sys, infra.registry; "
        "print([m for m in sys.modules if m.startswith(('azure.mgmt', 'azure.identity'))])"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "[]"


# ---- the component, under Pulumi's mocks ---------------------------------------------------

BYPASS = "pulumi-python:dynamic/acr:TaskBypass"


@pytest.fixture
def mocks():
    recorder = AzureMocks()
    pulumi.runtime.set_mocks(recorder, project="gpu-cluster", stack="unit", preview=False)
    return recorder


@pulumi.runtime.test
def test_the_registry_declares_its_bypass_and_that_provider_patches_it(mocks, arm):
    from infra.registry import Registry, RegistryArgs

    place = Placement("rg-unit", "eastus", {"team": "unit"})
    registry = Registry("unit", RegistryArgs(place, "unitacr12345678", ["198.51.100.7"]))

    def check(values):
        registry_id, urn = values
        assert urn.endswith(f"::gpucluster:infra:Registry${BYPASS}::unit-task-bypass")  # a child
        (declared,) = [r for r in mocks.resources if r.typ == BYPASS]
        inputs = dict(declared.inputs)
        assert declared.custom and inputs["registry_id"] == registry_id
        assert json.loads(inputs["registry_network"])[1:] == ["AzureServices", "Enabled"]
        # The provider Pulumi stores is this module's class, pickled by reference...
        stored = inputs.pop("__provider")
        stored = stored.get("value", stored) if isinstance(stored, dict) else stored  # a secret
        pickled = base64.b64decode(stored)
        assert b"infra.registry" in pickled and b"TaskBypassProvider" in pickled
        assert len(pickled) < 200
        provider = dill.loads(pickled)
        assert isinstance(provider, TaskBypassProvider)
        # ...and, given what the component declared, it PATCHes that very registry.
        arm.registry_path = registry_id
        assert provider.create(inputs).outs["allowed_for_tasks"] is True
        _assert_patch(arm.requests[0], registry_id)

    return pulumi.Output.all(registry.registry_id, registry.task_bypass.urn).apply(check)
