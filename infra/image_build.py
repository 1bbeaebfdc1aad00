"""Building the trainer image on ACR Tasks: the ``ImageBuild`` dynamic resource runs the
stack's build task (``infra.image.TrainerImage`` declares it) for one content tag, adopts a run
of that tag already under way, outlives throttling and 5xx answers up to the build's deadline,
and reports the pushed digest, or one line naming why the build did not push."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult

from infra import credentials
from infra.dynamic import OneLineError, Provider, changed_inputs
from infra.registry import ensure_task_bypass

BUILD_TIMEOUT_SECONDS = 7200  # Horovod's NCCL build dominates
ARM_ENDPOINT = "https://management.azure.com"
# Runs are scheduled and read with ACR's 2025-03-01-preview API, where scheduleRun answers
# 200 with the queued Run: no long-running operation, so none of the 2019-06-01-preview
# Azure-AsyncOperation bug that breaks azure-native's TaskRun after a good build
# (pulumi/pulumi-azure-native#1713, Azure/azure-rest-api-specs#19159).
RUN_API_VERSION = "2025-03-01-preview"
RUN_DONE = ("Succeeded", "Failed", "Canceled", "Error", "Timeout")  # RunStatus's final states
RUN_IN_PROGRESS = ("Queued", "Started", "Running")
POLL_SECONDS = 20.0
# What a poll may meet and outlive: throttling, ARM's and ACR's 5xx, a dropped connection.
# azure-core's own retry covers a blip (3 status retries for a GET); the build's deadline is
# the bound here, so calls go out with retry_total=0 and this loop is the one retry policy.
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
RUNS_LISTED = 20  # the task's newest runs searched for one to adopt
# ACR Tasks refused for the subscription (free trials, some offers): scheduleRun answers 400
# with this code (Azure-Samples/azure-search-openai-demo #2220, #2592).
TASKS_NOT_ALLOWED = "TasksOperationsNotAllowed"
QUEUE_GRACE_SECONDS = 3600  # a run may wait this long for an agent before its timeout starts
BUILD_OUTPUT_KEYS = ("run_id", "digest", "status")


class ImageBuildError(OneLineError):
    """An ACR run did not push the image; the message is one line naming the run."""


@dataclass(frozen=True)
class BuildSpec:
    """Everything a run depends on, as plain values (the dynamic resource's inputs)."""

    subscription_id: str
    resource_group_name: str
    registry_name: str
    task_id: str
    image: str  # trainer:<content tag>, as the task pushes it
    build_args: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> BuildSpec:
        return cls(
            subscription_id=props["subscription_id"],
            resource_group_name=props["resource_group_name"],
            registry_name=props["registry_name"],
            task_id=props["task_id"],
            image=props["image"],
            build_args=dict(props.get("build_args") or {}),
        )

    @property
    def registry_id(self) -> str:
        return (
            f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group_name}"
            f"/providers/Microsoft.ContainerRegistry/registries/{self.registry_name}"
        )

    def log_hint(self, run_id: str) -> str:
        return (
            f"see its log with `az acr task logs --registry {self.registry_name} --run-id "
            f"{run_id}` (or the registry's Tasks > Runs page in the portal)"
        )


def _client(subscription_id: str) -> Any:
    # Any: the multi-API client types each operation group as a union over API versions.
    from infra.azure_sdk import ContainerRegistryManagementClient

    return ContainerRegistryManagementClient(
        credentials.credential(),
        subscription_id,
        api_version=RUN_API_VERSION,
        base_url=ARM_ENDPOINT,
    )


def _pushed_digest(run: Any, image: str, exact: bool = False) -> str | None:
    """The digest ``run`` pushed for ``image``; unless ``exact``, the one image of a run that
    pushed one (the run this build scheduled)."""
    repository, _, tag = image.partition(":")
    images = list(run.output_images or [])
    for pushed in images:
        if pushed.repository == repository and pushed.tag == tag and pushed.digest:
            return pushed.digest
    return images[0].digest if len(images) == 1 and not exact else None


def _transient(err: Exception) -> bool:
    from trainer.common.azure_sdk import (
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(err, (ServiceRequestError, ServiceResponseError)):
        return True  # no answer: a reset, a timeout, a name that did not resolve
    return isinstance(err, HttpResponseError) and err.status_code in TRANSIENT_STATUS


def _error_code(err: Exception) -> str:
    return str(getattr(getattr(err, "error", None), "code", None) or "")


def _reason(err: Exception) -> str:
    status = getattr(err, "status_code", None)
    message = getattr(err, "message", None) or str(err)
    return f"HTTP {status}: {message}" if status else message


class _Runs:
    """The build task's runs on one registry, every call retried through transient errors
    until ``deadline`` (``time.monotonic()``)."""

    def __init__(self, spec: BuildSpec, deadline: float) -> None:
        self.spec = spec
        self.deadline = deadline
        self.client = _client(spec.subscription_id)
        self.where = (spec.resource_group_name, spec.registry_name)
        self.task_name = spec.task_id.rsplit("/", 1)[-1]

    def call(self, what: str, hint: str, operation: Any) -> Any:
        """``operation(retry_total=0)``, retried every POLL_SECONDS while it fails transiently
        and the deadline allows; any other failure is one line naming ``what``."""
        from trainer.common.azure_sdk import AzureError

        while True:
            try:
                return operation(retry_total=0)
            except AzureError as err:
                if not _transient(err):
                    raise ImageBuildError(f"could not {what}: {_reason(err)}{hint}") from None
                if time.monotonic() > self.deadline:
                    raise ImageBuildError(
                        f"could not {what}: still failing at the build's deadline "
                        f"({_reason(err)}){hint}"
                    ) from None
            time.sleep(POLL_SECONDS)

    def adoptable(self) -> Any | None:
        """A run of this task started since the task last changed (so for this tag and these
        build arguments: the task names one image) that is still going or pushed the image;
        the newest. Runs - List filters on TaskName and Status (REST reference,
        container-registry-tasks runs/list: OData over RunFilter, 'contains' the one string
        function)."""
        task = self.call(
            f"read build task {self.task_name}",
            "",
            lambda **kw: self.client.tasks.get(*self.where, self.task_name, **kw),
        )
        changed = getattr(task.system_data, "last_modified_at", None) or task.creation_date
        if changed is None:
            return None
        states = " or ".join(f"Status eq '{s}'" for s in (*RUN_IN_PROGRESS, "Succeeded"))
        query = f"TaskName eq '{self.task_name}' and ({states})"
        runs = self.call(
            f"list the runs of build task {self.task_name}",
            "",
            lambda **kw: list(
                self.client.runs.list(*self.where, filter=query, top=RUNS_LISTED, **kw)
            ),
        )
        fresh = [r for r in runs if r.create_time is not None and r.create_time >= changed]
        for run in sorted(fresh, key=lambda r: r.create_time, reverse=True):
            if run.status in RUN_IN_PROGRESS or _pushed_digest(run, self.spec.image, exact=True):
                return run
        return None

    def schedule(self) -> Any:
        from infra.azure_sdk import TaskRunRequest
        from trainer.common.azure_sdk import HttpResponseError

        request = TaskRunRequest(task_id=self.spec.task_id)
        try:
            # Not retried: a POST that failed may still have queued a run (the next `up`
            # adopts it).
            return self.client.registries.schedule_run(*self.where, request)
        except HttpResponseError as err:
            if _error_code(err) == TASKS_NOT_ALLOWED:
                raise ImageBuildError(
                    f"imageBuilder=acr: ACR Tasks are not permitted for registry "
                    f"{self.spec.registry_name} in this subscription ({TASKS_NOT_ALLOWED}); "
                    "set imageBuilder: docker in the stack to build with a local Docker, or ask "
                    "Azure support to allow ACR Tasks"
                ) from None
            raise ImageBuildError(
                f"could not start build task {self.task_name} on registry "
                f"{self.spec.registry_name}: {err.message}"
            ) from None

    def wait(self, run: Any) -> Any:
        run_id = str(run.run_id)
        hint = f"; {self.spec.log_hint(run_id)}"
        while run.status not in RUN_DONE:
            if time.monotonic() > self.deadline:
                raise ImageBuildError(
                    f"image build run {run_id} is still {run.status} after "
                    f"{BUILD_TIMEOUT_SECONDS + QUEUE_GRACE_SECONDS} s{hint}"
                )
            time.sleep(POLL_SECONDS)
            run = self.call(
                f"read image build run {run_id} on registry {self.spec.registry_name}",
                hint,
                lambda **kw: self.client.runs.get(*self.where, run_id, **kw),
            )
        return run


def run_build(spec: BuildSpec) -> dict[str, str]:
    """Adopt the task's run for this image (one still going, or one that pushed it), else
    check that the registry lets tasks through (``ensure_task_bypass``) and schedule the task
    once; wait for the run to end and return its id, status and the digest it pushed; any other
    end raises ``ImageBuildError``."""
    runs = _Runs(spec, time.monotonic() + BUILD_TIMEOUT_SECONDS + QUEUE_GRACE_SECONDS)
    adopted = runs.adoptable()
    if adopted is None:
        # A run the registry's network rules refuse fails only at its push, many minutes in.
        ensure_task_bypass(spec.registry_id)
    run = runs.wait(adopted or runs.schedule())
    run_id = str(run.run_id)
    succeeded = run.status == "Succeeded"
    digest = _pushed_digest(run, spec.image, exact=adopted is not None) if succeeded else None
    if not digest:
        reason = run.run_error_message or (
            "no image was pushed" if run.status == "Succeeded" else "no error message"
        )
        raise ImageBuildError(
            f"image build run {run_id} on registry {spec.registry_name} ended {run.status}: "
            f"{reason}; {spec.log_hint(run_id)}"
        )
    return {"run_id": run_id, "digest": digest, "status": str(run.status)}


class ImageBuildProvider(Provider):
    """Runs the build task once per set of inputs (a new content tag, new build arguments or a
    new task/registry). Keep this class's name and module: stacks refer to them."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        outputs = run_build(BuildSpec.from_props(props))
        return CreateResult(outputs["run_id"], {**props, **outputs})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = changed_inputs(olds, news, BUILD_OUTPUT_KEYS)
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=False)


@dataclass(frozen=True)
class ImageBuildArgs:
    subscription_id: pulumi.Input[str]
    resource_group_name: pulumi.Input[str]
    registry_name: pulumi.Input[str]
    task_id: pulumi.Input[str]
    image: str
    build_args: Mapping[str, str]


class ImageBuild(pulumi.dynamic.Resource, module="acr", name="ImageBuild"):
    """One run of the build task; ``digest`` is what the run pushed."""

    run_id: pulumi.Output[str]
    digest: pulumi.Output[str]
    status: pulumi.Output[str]

    def __init__(
        self, name: str, args: ImageBuildArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props: dict[str, Any] = {
            "subscription_id": args.subscription_id,
            "resource_group_name": args.resource_group_name,
            "registry_name": args.registry_name,
            "task_id": args.task_id,
            "image": args.image,
            "build_args": dict(args.build_args),
        }
        props.update({key: None for key in BUILD_OUTPUT_KEYS})
        super().__init__(ImageBuildProvider(), name, props, opts)
