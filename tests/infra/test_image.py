"""The trainer image builders, under Pulumi's mocks."""

import json

import pulumi
import pytest

from dt_commands.mocks import SUBSCRIPTION_ID, _fake_digest
from dt_commands.plan import evaluate
from infra import image as image_module
from infra.identity import ACR_PUSH
from infra.image import ACR_TOKEN_USER
from infra.image_inputs import REPO, content_tag
from infra.image_source import source_state
from infra.naming import PROJECT
from infra.settings.checks import ConfigError
from infra.settings.secrets import secret_setting
from tests.support.stacks import CLIENT_IP, of_type, one, stack_values

SECRET_ENVELOPE = "4dabf18193072939515e22adb298388d"
BUILD = "pulumi-python:dynamic/acr:ImageBuild"
TASK = "azure-native:containerregistry:Task"


def _login(plan):
    return (
        one(plan, "azure-native:containerregistry:Registry").inputs["registryName"] + ".azurecr.io"
    )


def _secret_values(value):
    """Every value the mocks received inside a secret envelope, at any depth."""
    if isinstance(value, dict):
        if SECRET_ENVELOPE in value:
            yield value["value"]
        else:
            for item in value.values():
                yield from _secret_values(item)
    elif isinstance(value, list):
        for item in value:
            yield from _secret_values(item)


def test_acr_builder_declares_a_named_task_with_its_own_identity(dev_plan):
    s = dev_plan.settings
    task = one(dev_plan, TASK).inputs
    registry = one(dev_plan, "azure-native:containerregistry:Registry").inputs
    commit = source_state().commit
    assert task["taskName"] == "build-trainer"
    assert task["registryName"] == registry["registryName"]
    assert task["resourceGroupName"] == "rg-platform-dev"
    assert task["location"] == s.location and task["tags"]["team"] == s.team
    assert task["identity"]["type"] == "SystemAssigned"
    assert task["platform"] == {"os": "Linux", "architecture": "amd64"}
    assert task["agentConfiguration"] == {"cpu": 8} and task["timeout"] == 7200
    assert task["status"] == "Enabled" and "trigger" not in task  # the stack runs it
    # Trusted-services bypass: no default source-registry login, the task's own identity.
    assert task["credentials"] == {
        "sourceRegistry": {"loginMode": "None"},
        "customRegistries": {_login(dev_plan): {"identity": "[system]"}},
    }
    assert task["step"] == {
        "type": "Docker",
        "dockerFilePath": "docker/Dockerfile",
        "contextPath": f"{s.image.source_repo}#{commit}",
        # The content tag the jobs pull by digest, and the tag the pool prefetches.
        "imageNames": [f"trainer:{content_tag()}", "trainer:prefetch"],
        "isPushEnabled": True,
        "noCache": False,
        "arguments": [
            {"name": "BASE_IMAGE", "value": s.image.base, "isSecret": False},
        ],
    }
    assert not any(r.typ == "azure-native:containerregistry:TaskRun" for r in dev_plan.resources)


def test_the_task_identity_holds_acrpush_on_the_registry(dev_plan):
    task = one(dev_plan, TASK)
    grant = one(dev_plan, "azure-native:authorization:RoleAssignment", "-buildtask-acrpush").inputs
    registry = one(dev_plan, "azure-native:containerregistry:Registry").inputs["registryName"]
    assert grant["principalId"] == f"principal-{task.name}"  # the task's, not a shared identity
    assert grant["principalType"] == "ServicePrincipal"
    assert grant["roleDefinitionId"] == (
        f"/subscriptions/{SUBSCRIPTION_ID}/providers/Microsoft.Authorization/roleDefinitions/"
        f"{ACR_PUSH}"
    )
    assert grant["scope"].endswith(f"/containerregistry/{registry}")


def test_one_build_per_tag_after_the_task_and_grant_and_the_job_gets_its_digest(dev_plan):
    tag = content_tag()
    build = one(dev_plan, BUILD)
    task = one(dev_plan, TASK)
    s = dev_plan.settings
    assert build.inputs["image"] == f"trainer:{tag}"
    assert build.inputs["task_id"].endswith(f"/containerregistry/{task.name}")
    assert build.inputs["registry_name"] == task.inputs["registryName"]
    assert build.inputs["resource_group_name"] == "rg-platform-dev"
    assert build.inputs["subscription_id"] == SUBSCRIPTION_ID
    assert build.inputs["build_args"] == {"BASE_IMAGE": s.image.base}
    assert SECRET_ENVELOPE in build.inputs["__provider"]  # pickled provider, a secret
    stem = dev_plan.outputs["resource_group_name"][3:]
    assert sorted(dev_plan.depends_on[build.name]) == sorted(
        [task.name, f"{stem}-buildtask-acrpush", f"{stem}-task-bypass"]
    )
    digest = dev_plan.outputs["image_digest"]  # what the mocked run returned
    assert digest == _fake_digest(build.inputs["image"])
    ref = f"{_login(dev_plan)}/trainer:{tag}@{digest}"
    assert dev_plan.outputs["image_ref"] == ref
    assert one(dev_plan, "pulumi-python:dynamic:Resource").inputs["image_ref"] == ref


def test_public_repository_sends_no_token(dev_plan):
    assert "contextAccessToken" not in one(dev_plan, TASK).inputs["step"]
    assert not list(_secret_values(one(dev_plan, TASK).inputs))


def test_source_token_reaches_the_task_only_as_a_secret():
    # How the offline plan sees `pulumi config set --secret imageSourceToken ...`.
    stored = {"secure": "v1:ZW5jcnlwdGVk"}
    plan = evaluate("dev", {**stack_values("dev"), "gpu-cluster:imageSourceToken": stored})
    task = one(plan, TASK).inputs
    # The secret token makes the whole step a secret: state and plan show it as [secret].
    assert set(task["step"]) == {SECRET_ENVELOPE, "value"}
    assert task["step"]["value"]["contextAccessToken"] == json.dumps(stored)
    assert task["step"]["value"]["imageNames"] == [f"trainer:{content_tag()}", "trainer:prefetch"]
    outside = {key: value for key, value in task.items() if key != "step"}
    assert "v1:ZW5jcnlwdGVk" not in json.dumps(outside)
    assert "v1:ZW5jcnlwdGVk" not in json.dumps(plan.outputs)
    assert not any("v1:ZW5jcnlwdGVk" in json.dumps(r.inputs) for r in of_type(plan, BUILD))


def test_a_token_stored_in_plain_text_is_refused():
    with pytest.raises(ConfigError, match=r"imageSourceToken: stored in plain text.*--secret"):
        evaluate("dev", {**stack_values("dev"), "gpu-cluster:imageSourceToken": "ghp_plain"})


@pulumi.runtime.test
def test_secret_setting_is_a_secret_output():
    key = f"{PROJECT}:imageSourceToken"
    pulumi.runtime.set_all_config({key: "ghp_token"}, secret_keys=[key])
    try:
        token = secret_setting("imageSourceToken")
    finally:
        pulumi.runtime.set_all_config({}, secret_keys=[])
    assert token is not None

    def check(is_secret):
        assert is_secret is True

    return pulumi.Output.from_input(pulumi.Output.is_secret(token)).apply(check)


def test_docker_builder_pushes_with_an_entra_token_never_the_admin_user(monkeypatch):
    monkeypatch.setattr(image_module, "exchange_acr_token", lambda server: f"token-for-{server}")
    values = {
        **stack_values("dev"),
        "gpu-cluster:imageBuilder": "docker",
        "gpu-cluster:imageBaseDigest": "sha256:" + "ab" * 32,
        # The push comes from this machine: the registry's firewall must admit it.
        "gpu-cluster:registryAllowedIps": json.dumps([CLIENT_IP]),
    }
    plan = evaluate("dev", values)
    built = one(plan, "docker-build:index:Image")
    login = _login(plan)
    tag = content_tag()
    assert built.inputs["push"] is True and built.inputs["buildOnPreview"] is False
    assert built.inputs["platforms"] == ["linux/amd64"]
    assert built.inputs["tags"] == [f"{login}/trainer:{tag}", f"{login}/trainer:prefetch"]
    assert built.inputs["context"] == {"location": str(REPO)}
    assert built.inputs["dockerfile"] == {"location": str(REPO / "docker/Dockerfile")}
    # The digest pins the base inside the one reference FROM builds on.
    assert built.inputs["buildArgs"] == {
        "BASE_IMAGE": f"{plan.settings.image.base}@sha256:{'ab' * 32}",
    }
    registries = built.inputs["registries"]
    assert registries[SECRET_ENVELOPE]  # the password makes the whole input a secret
    (registry,) = registries["value"]
    assert registry == {
        "address": login,
        "username": ACR_TOKEN_USER,
        "password": f"token-for-{login}",
    }
    cache = f"{login}/trainer:buildcache"
    assert built.inputs["cacheFrom"] == [{"registry": {"ref": cache}}]
    (cache_to,) = built.inputs["cacheTo"]
    assert cache_to["registry"]["ref"] == cache and cache_to["registry"]["mode"] == "max"
    assert cache_to["registry"]["imageManifest"] is True
    assert cache_to["registry"]["ociMediaTypes"] is True
    assert plan.outputs["image_ref"] == f"{login}/trainer:{tag}@{plan.outputs['image_digest']}"
    assert not of_type(plan, TASK) and not of_type(plan, BUILD)


@pytest.mark.parametrize("key", ["trainerConfig", "imageBuilder"])
def test_bad_image_or_trainer_settings_stop_before_any_resource(key):
    bad = {"trainerConfig": "trainer/presets/nope.yaml", "imageBuilder": "podman"}[key]
    with pytest.raises(ConfigError, match=f"{key}="):
        evaluate("dev", {**stack_values("dev"), f"gpu-cluster:{key}": bad})


def test_acr_token_exchange_posts_the_entra_token_and_returns_the_refresh_token(monkeypatch):
    import io
    import urllib.parse

    from infra import credentials

    class FakeCredential:
        def get_token(self, scope):
            assert scope == "https://management.azure.com/.default"
            return type("Token", (), {"token": "entra-access-token"})()

    sent = {}

    def fake_urlopen(request, timeout):
        sent["url"], sent["form"] = request.full_url, urllib.parse.parse_qs(request.data.decode())
        return io.BytesIO(json.dumps({"refresh_token": "acr-refresh-token"}).encode())

    monkeypatch.setattr(credentials, "credential", FakeCredential)
    monkeypatch.setattr(image_module.urllib.request, "urlopen", fake_urlopen)
    assert image_module.exchange_acr_token("team.azurecr.io") == "acr-refresh-token"
    assert sent["url"] == "https://team.azurecr.io/oauth2/exchange"
    assert sent["form"] == {
        "grant_type": ["access_token"],
        "service": ["team.azurecr.io"],
        "access_token": ["entra-access-token"],
    }
