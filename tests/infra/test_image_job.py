"""The trainer image builders and the TrainingJob resource, under Pulumi's mocks."""

import json
import shutil

import pytest

from infra import image as image_module
from infra.image import ACR_TOKEN_USER, IMAGE_INPUTS, REPO, content_tag
from infra.plan import evaluate
from tests.infra.conftest import one, stack_values
from trainer.cli import to_flags

SECRET_ENVELOPE = "4dabf18193072939515e22adb298388d"


def test_acr_task_builds_the_commit_with_the_content_tag(dev_plan):
    tag = content_tag()
    run = one(dev_plan, "azure-native:containerregistry:TaskRun")
    registry = one(dev_plan, "azure-native:containerregistry:Registry")
    assert run.inputs["registryName"] == registry.inputs["registryName"]
    assert run.inputs["resourceGroupName"] == "rg-platform-dev"
    assert run.inputs["forceUpdateTag"] == tag
    request = run.inputs["runRequest"]
    commit, _ = image_module.source_commit()
    assert request == {
        "type": "DockerBuildRequest",
        "dockerFilePath": "docker/Dockerfile",
        "sourceLocation": f"https://github.com/example-org/distributed-training.git#{commit}",
        "platform": {"os": "Linux", "architecture": "amd64"},
        "imageNames": [f"trainer:{tag}"],
        "isPushEnabled": True,
        "isArchiveEnabled": False,  # azure-native's defaults, sent as set
        "noCache": False,
        "timeout": 7200,
        "agentConfiguration": {"cpu": 8},
        "arguments": [
            {
                "name": "BASE_IMAGE",
                "value": "nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04",
                "isSecret": False,
            },
            {"name": "BASE_DIGEST", "value": "", "isSecret": False},
        ],
    }
    digest = dev_plan.outputs["image_digest"]
    assert digest.startswith("sha256:")
    login = registry.inputs["registryName"] + ".azurecr.io"
    assert dev_plan.outputs["image_ref"] == f"{login}/trainer:{tag}@{digest}"


def test_docker_builder_pushes_with_an_entra_token_never_the_admin_user(monkeypatch):
    monkeypatch.setattr(image_module, "exchange_acr_token", lambda server: f"token-for-{server}")
    values = {
        **stack_values("dev"),
        "gpu-cluster:imageBuilder": "docker",
        "gpu-cluster:imageBaseDigest": "sha256:" + "ab" * 32,
    }
    plan = evaluate("dev", values)
    built = one(plan, "docker-build:index:Image")
    login = (
        one(plan, "azure-native:containerregistry:Registry").inputs["registryName"] + ".azurecr.io"
    )
    tag = content_tag()
    assert built.inputs["push"] is True and built.inputs["buildOnPreview"] is False
    assert built.inputs["platforms"] == ["linux/amd64"]
    assert built.inputs["tags"] == [f"{login}/trainer:{tag}"]
    assert built.inputs["context"] == {"location": str(REPO)}
    assert built.inputs["dockerfile"] == {"location": str(REPO / "docker/Dockerfile")}
    assert built.inputs["buildArgs"] == {
        "BASE_IMAGE": "nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04",
        "BASE_DIGEST": "sha256:" + "ab" * 32,
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
    assert not any(r.typ == "azure-native:containerregistry:TaskRun" for r in plan.resources)


def test_job_takes_the_image_digest_and_the_pool_and_waits_for_the_cluster(dev_plan):
    job = one(dev_plan, "pulumi-python:dynamic:Resource")
    pool = one(dev_plan, "azure-native:batch:Pool")
    account = one(dev_plan, "azure-native:batch:BatchAccount")
    nodes = one(dev_plan, "azure-native:managedidentity:UserAssignedIdentity", "-nodes")
    s = dev_plan.settings
    assert job.inputs["image_ref"] == dev_plan.outputs["image_ref"]  # data dependency on image
    assert job.inputs["pool_id"] == pool.inputs["poolName"] == "ib-gpu"
    assert job.inputs["endpoint"] == f"https://{dev_plan.outputs['batch_account_endpoint']}"
    assert job.inputs["account_id"].endswith(f"/batch/{account.inputs['accountName']}")
    assert job.inputs["node_count"] == s.max_nodes and job.inputs["vm_size"] == s.vm_size
    assert job.inputs["node_identity_client_id"] == f"client-{nodes.name}"
    assert job.inputs["trainer_args"] == to_flags(s.trainer_settings())
    assert job.inputs["dataset_prefix"] == ""
    assert job.inputs["blob_endpoint"].endswith(".blob.core.windows.net/")
    assert dev_plan.depends_on[job.name] == ["platform-dev"]  # the GpuCluster component
    assert dev_plan.outputs["job_id"].startswith("dev-")
    assert dev_plan.outputs["job_state"] == "active"
    assert dev_plan.outputs["job_log_url"].endswith(f"/logs/{dev_plan.outputs['job_id']}/")


def test_submit_job_false_stands_up_the_environment_only():
    plan = evaluate("dev", {**stack_values("dev"), "gpu-cluster:submitJob": False})
    assert not any(r.typ == "pulumi-python:dynamic:Resource" for r in plan.resources)
    assert "job_id" not in plan.outputs and "image_ref" in plan.outputs


def test_content_tag_changes_with_the_trainer_and_ignores_bytecode(tmp_path):
    for entry in IMAGE_INPUTS:
        source = REPO / entry
        target = tmp_path / entry
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    tag = content_tag(tmp_path)
    assert tag == content_tag(REPO) and len(tag) == 16
    (tmp_path / "trainer" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "trainer" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert content_tag(tmp_path) == tag
    with open(tmp_path / "trainer" / "model.py", "a") as file:
        file.write("\n# changed\n")
    assert content_tag(tmp_path) != tag


@pytest.mark.parametrize("key", ["trainerConfig", "imageBuilder"])
def test_bad_image_or_trainer_settings_stop_before_any_resource(key):
    from infra.config import ConfigError

    bad = {"trainerConfig": "trainer/presets/nope.yaml", "imageBuilder": "podman"}[key]
    with pytest.raises(ConfigError, match=f"{key}="):
        evaluate("dev", {**stack_values("dev"), f"gpu-cluster:{key}": bad})


def test_dataset_prefix_switches_the_job_to_staged_shards():
    plan = evaluate("dev", {**stack_values("dev"), "gpu-cluster:datasetPrefix": "imagenet"})
    job = one(plan, "pulumi-python:dynamic:Resource")
    assert job.inputs["dataset_prefix"] == "imagenet"
    assert "--data" not in job.inputs["trainer_args"]  # the job sets data and data_dir
    assert json.dumps(job.inputs["trainer_args"]).count("--backend") == 0


def test_acr_token_exchange_posts_the_entra_token_and_returns_the_refresh_token(monkeypatch):
    import io
    import urllib.parse

    import azure.identity

    class FakeCredential:
        def get_token(self, scope):
            assert scope == "https://management.azure.com/.default"
            return type("Token", (), {"token": "entra-access-token"})()

    sent = {}

    def fake_urlopen(request, timeout):
        sent["url"], sent["form"] = request.full_url, urllib.parse.parse_qs(request.data.decode())
        return io.BytesIO(json.dumps({"refresh_token": "acr-refresh-token"}).encode())

    monkeypatch.setattr(azure.identity, "DefaultAzureCredential", FakeCredential)
    monkeypatch.setattr(image_module.urllib.request, "urlopen", fake_urlopen)
    assert image_module.exchange_acr_token("team.azurecr.io") == "acr-refresh-token"
    assert sent["url"] == "https://team.azurecr.io/oauth2/exchange"
    assert sent["form"] == {
        "grant_type": ["access_token"],
        "service": ["team.azurecr.io"],
        "access_token": ["entra-access-token"],
    }
