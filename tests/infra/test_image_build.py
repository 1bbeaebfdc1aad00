"""The ImageBuild dynamic provider: its create runs the real azure-mgmt-containerregistry client
against a fake ARM endpoint (HTTPS on 127.0.0.1 with a self-signed certificate trusted through
REQUESTS_CA_BUNDLE), which records what the client sends and answers like ACR's run API."""

import base64
import subprocess
import sys

import pytest

from infra import image as image_module
from infra.image import (
    RUN_API_VERSION,
    BuildSpec,
    ImageBuildError,
    ImageBuildProvider,
)
from tests.infra.conftest import REPO
from tests.infra.fake_arm import serving_arm

SUB = "00000000-0000-0000-0000-00000000abcd"
REGISTRY_PATH = (
    f"/subscriptions/{SUB}/resourceGroups/rg-team-dev/providers/"
    "Microsoft.ContainerRegistry/registries/teamacr"
)
TASK_ID = f"{REGISTRY_PATH}/tasks/build-trainer"
DIGEST = "sha256:" + "c" * 64
SPEC = BuildSpec(
    subscription_id=SUB,
    resource_group_name="rg-team-dev",
    registry_name="teamacr",
    task_id=TASK_ID,
    image="trainer:0123456789abcdef",
    build_args={"BASE_IMAGE": "nvidia/cuda:13.0.1-devel-ubuntu22.04"},
)


def _props(spec=SPEC):
    return {**spec.__dict__, "build_args": dict(spec.build_args)}


def _run(status, **extra):
    return {
        "id": f"{REGISTRY_PATH}/runs/ca7",
        "name": "ca7",
        "type": "Microsoft.ContainerRegistry/registries/runs",
        "properties": {"runId": "ca7", "status": status, **extra},
    }


class FakeArm:
    """Records requests; ``schedule`` answers scheduleRun, ``runs`` the successive run GETs."""

    def __init__(self):
        self.requests = []
        self.schedule = (200, _run("Queued"))
        self.runs = [_run("Running"), _run("Succeeded")]

    def handle(self, method, path, query, headers, body):
        self.requests.append(
            {"method": method, "path": path, "query": query, "headers": headers, "body": body}
        )
        if method == "POST" and path == f"{REGISTRY_PATH}/scheduleRun":
            return self.schedule
        if method == "GET" and path == f"{REGISTRY_PATH}/runs/ca7":
            return 200, self.runs.pop(0) if len(self.runs) > 1 else self.runs[0]
        return 404, {"error": {"code": "NotFound", "message": f"{method} {path}"}}


@pytest.fixture
def arm(tmp_path, monkeypatch):
    fake = FakeArm()

    def handle(*request):
        status, answer = fake.handle(*request)
        return status, {}, answer

    with serving_arm(tmp_path, monkeypatch, handle) as base:
        monkeypatch.setattr(image_module, "ARM_ENDPOINT", base)
        monkeypatch.setattr(image_module, "POLL_SECONDS", 0)
        yield fake


def test_create_schedules_the_task_once_and_returns_the_pushed_digest(arm):
    arm.runs[-1] = _run(
        "Succeeded",
        outputImages=[
            {"registry": "teamacr.azurecr.io", "repository": "other", "tag": "x", "digest": "no"},
            {
                "registry": "teamacr.azurecr.io",
                "repository": "trainer",
                "tag": "0123456789abcdef",
                "digest": DIGEST,
            },
        ],
    )
    result = ImageBuildProvider().create(_props())
    assert result.id == "ca7"
    assert result.outs == {**_props(), "run_id": "ca7", "digest": DIGEST, "status": "Succeeded"}
    schedule, *polls = arm.requests
    assert schedule["method"] == "POST" and schedule["path"] == f"{REGISTRY_PATH}/scheduleRun"
    assert schedule["query"] == {"api-version": [RUN_API_VERSION]}
    assert schedule["body"] == {
        "type": "TaskRunRequest",
        "isArchiveEnabled": False,
        "taskId": TASK_ID,
    }
    assert schedule["headers"]["Authorization"] == "Bearer fake-arm-token"
    assert [(p["method"], p["path"]) for p in polls] == [("GET", f"{REGISTRY_PATH}/runs/ca7")] * 2


def test_a_failed_run_is_one_line_naming_the_run_its_status_and_its_log(arm):
    arm.runs = [_run("Failed", runErrorMessage="failed to build:\nstep 7 exited 1")]
    with pytest.raises(ImageBuildError) as failed:
        ImageBuildProvider().create(_props())
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("image build run ca7 on registry teamacr ended Failed: ")
    assert "step 7 exited 1" in message
    assert "az acr task logs --registry teamacr --run-id ca7" in message


def test_a_run_that_pushed_nothing_is_an_error(arm):
    arm.runs = [_run("Succeeded", outputImages=[])]
    with pytest.raises(ImageBuildError, match=r"ca7 .* ended Succeeded: no image was pushed"):
        ImageBuildProvider().create(_props())


def test_a_refused_schedule_names_the_task_and_the_registry(arm):
    arm.schedule = (403, {"error": {"code": "AuthorizationFailed", "message": "no access"}})
    with pytest.raises(ImageBuildError, match="could not start build task build-trainer on"):
        ImageBuildProvider().create(_props())
    assert len(arm.requests) == 1  # nothing polled, nothing retried into a second run


def test_only_real_input_changes_rebuild():
    provider = ImageBuildProvider()
    olds = {**_props(), "__provider": "old code", "run_id": "ca7", "digest": DIGEST}
    news = {**_props(), "__provider": "new code", "run_id": None, "digest": None}
    assert provider.diff("ca7", olds, news).changes is False  # provider code or outputs
    retag = provider.diff("ca7", olds, {**news, "image": "trainer:fedcba9876543210"})
    assert retag.changes is True and retag.replaces == ["image"]
    pinned = "nvidia/cuda:13.0.1-devel-ubuntu22.04@sha256:" + "d" * 64
    rebase = {**news, "build_args": {"BASE_IMAGE": pinned}}
    assert provider.diff("ca7", olds, rebase).replaces == ["build_args"]


def test_the_provider_is_pickled_by_reference():
    from pulumi.dynamic.dynamic import serialize_provider

    pickled = base64.b64decode(serialize_provider(ImageBuildProvider()))
    assert b"infra.image" in pickled and b"ImageBuildProvider" in pickled
    assert len(pickled) < 200  # a reference, not the class's code


def test_importing_the_provider_module_loads_no_azure_sdk():
    code = (
        "import sys, infra.image; "
        "print([m for m in sys.modules if m.startswith(('azure.mgmt', 'azure.identity'))])"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "[]"
