"""The ImageBuild dynamic provider: its create runs the real azure-mgmt-containerregistry client
against a fake ARM endpoint (HTTPS on 127.0.0.1 with a self-signed certificate trusted through
REQUESTS_CA_BUNDLE), which records what the client sends and answers like ACR's run API."""

import base64
import pickle
import re
import subprocess
import sys

import pytest

from infra import image_build as build_module
from infra import registry as registry_module
from infra.image_build import RUN_API_VERSION, BuildSpec, ImageBuildError, ImageBuildProvider
from infra.registry import TaskBypassError
from tests.infra.fake_arm import (
    BYPASS_PATCH,
    DROP,
    OPERATION,
    REGISTRY_ID,
    SUB,
    FakeRegistry,
    serving_arm,
)
from tests.support.stacks import REPO

REGISTRY_PATH = REGISTRY_ID
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


TASK_CHANGED = "2026-11-20T10:00:00+00:00"  # the task's last update (systemData)
AFTER, BEFORE = "2026-11-20T10:00:05+00:00", "2026-11-20T09:00:00+00:00"


def _run(status, run_id="ca7", created=AFTER, **extra):
    return {
        "id": f"{REGISTRY_PATH}/runs/{run_id}",
        "name": run_id,
        "type": "Microsoft.ContainerRegistry/registries/runs",
        "properties": {
            "runId": run_id,
            "status": status,
            "task": "build-trainer",
            "runType": "QuickRun",
            "createTime": created,
            **extra,
        },
    }


def _pushed(tag="0123456789abcdef", digest=DIGEST):
    return [
        {"registry": "teamacr.azurecr.io", "repository": "trainer", "tag": tag, "digest": digest}
    ]


def _error(code, message):
    return {"error": {"code": code, "message": message}}


# Runs - List's $filter (REST reference, container-registry-tasks runs/list): OData over the
# RunFilter properties, 'contains' the only string function, no 'not'. The fake evaluates
# what it is sent and refuses a property it does not know, as ACR does.
FILTER_PROPERTIES = {"taskname": "task", "status": "status", "runid": "runId"}
_TOKEN = re.compile(r"\s*(\(|\)|,|'(?:[^']|'')*'|[A-Za-z]+)")


def _matches(expression: str, run: dict) -> bool:
    python = []
    for token in _TOKEN.findall(expression):
        word = token.lower()
        if token.startswith("'"):
            python.append(repr(token[1:-1].replace("''", "'")))
        elif word in ("and", "or", "(", ")", ","):
            python.append(f" {word} " if word.isalpha() else token)
        elif word in ("eq", "ne"):
            python.append(" == " if word == "eq" else " != ")
        elif word == "contains":
            python.append("_contains")
        elif word in FILTER_PROPERTIES:
            python.append(repr(str(run["properties"].get(FILTER_PROPERTIES[word], ""))))
        else:
            raise ValueError(f"unknown filter property {token}")
    return bool(eval("".join(python), {"_contains": lambda a, b: b in a, "__builtins__": {}}))


class FakeArm:
    """ACR's run API as the image build uses it: ``schedule`` answers scheduleRun, ``runs`` the
    successive GETs of the run it queues (ca7), ``failures`` what the next GETs of a run answer
    first (a 503, a dropped connection), ``existing`` the registry's earlier runs (id -> its
    successive states), which Runs - List filters; the task was last changed at TASK_CHANGED.
    ``registry`` is the registry itself, its bypass for tasks on as the stack deployed it."""

    def __init__(self):
        self.requests = []
        self.registry = FakeRegistry(REGISTRY_PATH)
        self.registry.allowed = True
        self.schedule = (200, _run("Queued"))
        self.runs = [_run("Running"), _run("Succeeded", outputImages=_pushed())]
        self.failures: list[tuple[int, dict | None]] = []
        self.existing: dict[str, list[dict]] = {}

    def serve(self, method, path, query, headers, body):
        if path in (REGISTRY_PATH, OPERATION):
            self.requests.append({"method": method, "path": path, "query": query, "body": body})
            return self.registry.handle(method, path, query, headers, body)
        status, answer = self.handle(method, path, query, headers, body)
        return status, {}, answer

    def handle(self, method, path, query, headers, body):
        self.requests.append(
            {"method": method, "path": path, "query": query, "headers": headers, "body": body}
        )
        if method == "POST" and path == f"{REGISTRY_PATH}/scheduleRun":
            if self.schedule[0] == 200 and self.registry.refuses_tasks:
                # The task's identity is no longer let through the registry's network rules:
                # the run is queued and its push is refused with 403 (articles/
                # container-registry/manage-network-bypass-policy-for-tasks.md; the run's exact
                # error text is not documented).
                self.runs = [_run("Running"), _run("Failed", runErrorMessage=PUSH_REFUSED)]
            return self.schedule
        if method == "GET" and path == f"{REGISTRY_PATH}/runs":
            return self._list(query)
        if method == "GET" and path == TASK_ID:
            return 200, {
                "id": TASK_ID,
                "name": "build-trainer",
                "systemData": {"lastModifiedAt": TASK_CHANGED},
                "properties": {"creationDate": BEFORE, "status": "Enabled"},
            }
        if method == "GET" and path.startswith(f"{REGISTRY_PATH}/runs/"):
            # ARM and ACR fail now and then: 503 ServiceUnavailable, a reset connection.
            if self.failures:
                return self.failures.pop(0)
            run_id = path.rsplit("/", 1)[-1]
            if run_id in self.existing:
                states = self.existing[run_id]
                return 200, states.pop(0) if len(states) > 1 else states[0]
            if run_id == "ca7":
                return 200, self.runs.pop(0) if len(self.runs) > 1 else self.runs[0]
        return 404, _error("NotFound", f"{method} {path}")

    def _list(self, query):
        expression = (query.get("$filter") or [""])[0]
        current = [states[0] for states in self.existing.values()]
        try:
            listed = [r for r in current if not expression or _matches(expression, r)]
        except (ValueError, SyntaxError) as err:
            return 400, _error("InvalidFilter", str(err))
        top = int((query.get("$top") or ["100"])[0])
        return 200, {"value": listed[:top]}

    def of(self, method, suffix=""):
        return [r for r in self.requests if r["method"] == method and r["path"].endswith(suffix)]


PUSH_REFUSED = "failed to push teamacr.azurecr.io/trainer:0123456789abcdef: 403 Forbidden"


@pytest.fixture
def arm(tmp_path, monkeypatch):
    fake = FakeArm()
    with serving_arm(tmp_path, monkeypatch, fake.serve) as base:
        fake.registry.base = base
        monkeypatch.setattr(build_module, "ARM_ENDPOINT", base)
        monkeypatch.setattr(registry_module, "ARM_ENDPOINT", base)
        monkeypatch.setattr(build_module, "POLL_SECONDS", 0)
        monkeypatch.setattr(registry_module, "POLL_SECONDS", 0)
        yield fake


def test_create_schedules_the_task_once_and_returns_the_pushed_digest(arm):
    arm.runs[-1] = _run(
        "Succeeded",
        outputImages=[
            {"registry": "teamacr.azurecr.io", "repository": "other", "tag": "x", "digest": "no"},
            *_pushed(),
        ],
    )
    result = ImageBuildProvider().create(_props())
    assert result.id == "ca7"
    assert result.outs == {**_props(), "run_id": "ca7", "digest": DIGEST, "status": "Succeeded"}
    (schedule,) = arm.of("POST")
    assert schedule["path"] == f"{REGISTRY_PATH}/scheduleRun"
    assert schedule["query"] == {"api-version": [RUN_API_VERSION]}
    assert schedule["body"] == {
        "type": "TaskRunRequest",
        "isArchiveEnabled": False,
        "taskId": TASK_ID,
    }
    assert schedule["headers"]["Authorization"] == "Bearer fake-arm-token"
    assert len(arm.of("GET", "/runs/ca7")) == 2


def test_the_build_checks_the_registry_lets_tasks_through_before_it_schedules(arm):
    ImageBuildProvider().create(_props())
    calls = [(r["method"], r["path"]) for r in arm.requests]
    assert ("GET", REGISTRY_PATH) in calls and ("PATCH", REGISTRY_PATH) not in calls
    assert calls.index(("GET", REGISTRY_PATH)) < calls.index(
        ("POST", f"{REGISTRY_PATH}/scheduleRun")
    )


def test_a_bypass_turned_off_since_the_deploy_is_set_again_before_the_build(arm):
    arm.registry.allowed = False  # turned off in the portal after `pulumi up` set it
    result = ImageBuildProvider().create(_props())
    assert result.outs["digest"] == DIGEST and result.outs["status"] == "Succeeded"
    calls = [(r["method"], r["path"]) for r in arm.requests]
    patch = calls.index(("PATCH", REGISTRY_PATH))
    assert arm.requests[patch]["body"] == BYPASS_PATCH
    assert patch < calls.index(("POST", f"{REGISTRY_PATH}/scheduleRun"))


def test_a_bypass_that_cannot_be_set_again_stops_the_build_in_one_line(arm):
    arm.registry.allowed = False
    arm.registry.refuse = (403, {"error": {"code": "AuthorizationFailed", "message": "no write"}})
    with pytest.raises(TaskBypassError) as failed:
        ImageBuildProvider().create(_props())
    message = str(failed.value)
    assert "\n" not in message and "registry teamacr" in message
    assert "networkRuleBypassAllowedForTasks" in message and "az resource update --ids" in message
    assert not arm.of("POST")  # no build that would fail at its push


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
    arm.schedule = (403, _error("AuthorizationFailed", "no access"))
    with pytest.raises(ImageBuildError, match="could not start build task build-trainer on"):
        ImageBuildProvider().create(_props())
    assert len(arm.of("POST")) == 1  # not retried into a second run
    assert not arm.of("GET", "/runs/ca7")  # nothing polled


def test_failed_polls_are_retried_and_the_run_is_followed_to_its_end(arm):
    # One 503 is absorbed by azure-core's own retry policy (3 status retries for a GET);
    # an outage of a few polls, and a connection reset, are not.
    unavailable = (503, _error("ServiceUnavailable", "The service is temporarily unavailable."))
    arm.failures = [unavailable] * 4 + [(DROP, None), (429, _error("TooManyRequests", "slow"))]
    result = ImageBuildProvider().create(_props())
    assert result.outs["digest"] == DIGEST and result.outs["status"] == "Succeeded"
    assert len(arm.of("POST")) == 1  # still one build
    # Each failure cost one request and one poll interval: the provider's loop is the one
    # retry policy, bounded by the build's deadline.
    assert len(arm.of("GET", "/runs/ca7")) == 6 + 2


def test_a_run_in_progress_for_the_tag_is_adopted_not_scheduled_again(arm):
    # The last `pulumi up` queued ca6 for this tag and failed; the run went on in ACR.
    arm.existing = {
        "ca6": [_run("Running", "ca6"), _run("Succeeded", "ca6", outputImages=_pushed())],
        "ca5": [_run("Succeeded", "ca5", BEFORE, outputImages=_pushed(digest="sha256:old"))],
    }
    result = ImageBuildProvider().create(_props())
    assert not arm.of("POST")  # no second build
    assert result.id == "ca6"
    assert result.outs["digest"] == DIGEST and result.outs["run_id"] == "ca6"
    (listed,) = arm.of("GET", f"{REGISTRY_PATH}/runs")
    assert "TaskName eq 'build-trainer'" in listed["query"]["$filter"][0]


def test_a_succeeded_run_of_the_tag_since_the_task_changed_is_adopted_without_a_build(arm):
    arm.existing = {"ca6": [_run("Succeeded", "ca6", outputImages=_pushed())]}
    result = ImageBuildProvider().create(_props())
    assert not arm.of("POST")
    assert result.outs == {**_props(), "run_id": "ca6", "digest": DIGEST, "status": "Succeeded"}


@pytest.mark.parametrize(
    "earlier",
    [
        # Queued before the task last changed: built the task's previous definition.
        _run("Running", "ca6", BEFORE),
        # Built since, but another tag (or nothing) came out of it.
        _run("Succeeded", "ca6", outputImages=_pushed(tag="fedcba9876543210")),
        _run("Failed", "ca6"),
    ],
)
def test_other_runs_of_the_task_are_not_adopted(arm, earlier):
    arm.existing = {"ca6": [earlier]}
    result = ImageBuildProvider().create(_props())
    assert len(arm.of("POST")) == 1 and result.id == "ca7"


def test_acr_tasks_disabled_for_the_subscription_is_one_line_pointing_at_the_docker_builder(arm):
    # Azure-Samples/azure-search-openai-demo #2220 and #2592: scheduleRun answers 400
    # TasksOperationsNotAllowed where ACR Tasks are not permitted (free trial subscriptions).
    arm.schedule = (
        400,
        _error(
            "TasksOperationsNotAllowed",
            f"ACR Tasks requests for the registry teamacr and {SUB} are not permitted. Please "
            "file an Azure support request at http://aka.ms/azuresupport for assistance.",
        ),
    )
    with pytest.raises(ImageBuildError) as failed:
        ImageBuildProvider().create(_props())
    message = str(failed.value)
    assert "\n" not in message
    assert "TasksOperationsNotAllowed" in message and "imageBuilder: docker" in message


def test_a_poll_refused_for_good_is_one_line_naming_the_run(arm):
    arm.failures = [(403, _error("AuthorizationFailed", "the client has no access"))]
    with pytest.raises(ImageBuildError) as failed:
        ImageBuildProvider().create(_props())
    message = str(failed.value)
    assert "\n" not in message and "run ca7" in message and "no access" in message
    assert len(arm.of("GET", "/runs/ca7")) == 1  # not retried


def test_polls_failing_until_the_deadline_end_in_one_line(arm, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(build_module, "time", clock)
    monkeypatch.setattr(build_module, "POLL_SECONDS", 600)
    unavailable = (503, _error("ServiceUnavailable", "The service is temporarily unavailable."))
    arm.failures = [unavailable] * 1000
    with pytest.raises(ImageBuildError) as failed:
        ImageBuildProvider().create(_props())
    message = str(failed.value)
    assert "\n" not in message and "run ca7" in message and "503" in message
    assert clock.now > build_module.BUILD_TIMEOUT_SECONDS  # it waited out the deadline
    assert len(arm.of("POST")) == 1


class FakeClock:
    """``time`` for the provider: sleeping advances it, nothing waits."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


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
    assert b"infra.image_build" in pickled and b"ImageBuildProvider" in pickled
    assert len(pickled) < 200  # a reference, not the class's code
    # Stacks deployed before the build moved to its own module name it by the old path: their
    # refresh and destroy unpickle that reference (pickle's GLOBAL opcode, as dill writes it).
    assert pickle.loads(b"cinfra.image\nImageBuildProvider\n.") is ImageBuildProvider


def test_importing_the_provider_module_loads_no_azure_sdk():
    code = (
        "import sys, infra.image, infra.image_build; "
        "print([m for m in sys.modules if m.startswith(('azure.mgmt', 'azure.identity'))])"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "[]"
