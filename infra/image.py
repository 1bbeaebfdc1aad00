"""The trainer image: a content-addressed tag, built and pushed by the builder the stack picks.

The tag is a hash of everything the image is built from (the Dockerfile, its lock file, the
Horovod build script, the packaging files and the trainer sources): unchanged code gives the
same tag, so Pulumi sees no change, rebuilds nothing and resubmits no job.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_docker_build as docker_build
from pulumi.dynamic import CreateResult, DiffResult
from pulumi_azure_native import authorization, containerregistry

from infra import credentials
from infra.dynamic import OneLineError, Provider, changed_inputs
from infra.identity import ACR_PULL, ACR_PUSH, assign_role
from infra.image_inputs import DOCKERFILE, IMAGE_INPUTS, REPO
from infra.naming import Placement
from infra.registry import Registry, ensure_task_bypass
from infra.registry_mode import RegistryPullRole, RegistryPullRoleArgs
from infra.settings.checks import ConfigError
from infra.settings.image import ImageSettings
from infra.toolchain import base_reference

IMAGE_REPOSITORY = "trainer"
# ACR's token exchange wants this user name with a refresh token as the password.
ACR_TOKEN_USER = "00000000-0000-0000-0000-000000000000"
BUILD_TIMEOUT_SECONDS = 7200  # Horovod's NCCL build dominates
BUILD_AGENT_CPUS = 8  # the ACR Task agent's CPUs; billed per CPU-second (infra/prices.py)
BUILD_TASK_NAME = "build-trainer"  # one per registry, and each stack has its own registry
# A task's credential for its own system-assigned identity, as `az acr task credential add
# --use-identity [system]` writes it (MicrosoftDocs/azure-management-docs, articles/
# container-registry/container-registry-tasks-authentication-managed-identity.md, step 4).
SYSTEM_IDENTITY = "[system]"

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


@dataclass(frozen=True)
class SourceState:
    """What the acr builder would clone, and whether that is what the content tag describes."""

    commit: str  # the newest commit that changed the image inputs (same inputs as HEAD)
    dirty: bool  # the image inputs have uncommitted or untracked changes
    pushed: bool  # a remote-tracking branch contains ``commit``, so the remote can serve it


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def source_state(root: Path | None = None) -> SourceState:
    """Read the checkout at ``root`` (the repository by default). Raises ``OSError`` or
    ``CalledProcessError`` when git is missing or ``root`` is not a checkout."""
    root = root or REPO
    head = _git(root, "rev-parse", "HEAD")
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=all", "--", *IMAGE_INPUTS))
    # The commit that last changed the image inputs builds the same image as HEAD, and it
    # changes exactly when the content tag does: a commit that touches only infra/ does not
    # change the build task's definition, so a preview shows no task update for it.
    commit = _git(root, "log", "-1", "--format=%H", "HEAD", "--", *IMAGE_INPUTS) or head
    same = subprocess.run(
        ["git", "-C", str(root), "diff", "--quiet", commit, head, "--", *IMAGE_INPUTS],
        capture_output=True,
    )
    if same.returncode != 0:
        commit = head
    pushed = bool(_git(root, "branch", "--remotes", "--contains", commit))
    return SourceState(commit=commit, dirty=dirty, pushed=pushed)


def deploying() -> bool:
    """Whether this run builds: a real ``pulumi up``, not a preview and not Pulumi's mocks (the
    offline plan and the tests), where nothing is built and a warning is enough."""
    from pulumi.runtime.mocks import MockMonitor

    mocked = isinstance(pulumi.runtime.settings.get_monitor(), MockMonitor)
    return not pulumi.runtime.is_dry_run() and not mocked


def commit_to_build(root: Path | None = None, strict: bool | None = None) -> str:
    """The commit the acr builder builds (``<repo>#<commit>``), refused when it would not be the
    image its tag describes: uncommitted image inputs, or a commit the remote does not have.
    ``strict`` (default: ``deploying()``) raises ``ConfigError``; otherwise the same line is
    a warning. Called before any resource is declared."""
    strict = deploying() if strict is None else strict
    try:
        state = source_state(root)
    except (OSError, subprocess.CalledProcessError):
        raise ConfigError(
            "imageBuilder=acr: builds a git commit, but this folder is not a git checkout; "
            "run from a clone or use imageBuilder docker"
        ) from None
    short = state.commit[:12]
    problems = []
    if state.dirty:
        problems.append(
            f"imageBuilder=acr: the image inputs ({', '.join(IMAGE_INPUTS)}) have uncommitted "
            f"changes that the build of commit {short} would not contain, while the image tag "
            "hashes them; commit and push them, or use imageBuilder docker"
        )
    if not state.pushed:
        problems.append(
            f"imageBuilder=acr: commit {short} is not on the remote (no remote-tracking branch "
            "contains it), so ACR cannot clone it; push it first (git push), then run pulumi up"
        )
    for problem in problems:
        if strict:
            raise ConfigError(problem)
        pulumi.log.warn(f"{problem} (pulumi up will refuse this)")
    return state.commit


def exchange_acr_token(login_server: str) -> str:
    """An ACR refresh token for the caller's Entra identity (as ``az acr login --expose-token``).
    The registry's network rules apply first: a machine outside registryAllowedIps gets 403
    DENIED, which stops the program in one line (``pulumi.RunError``: no traceback)."""
    access = credentials.credential().get_token("https://management.azure.com/.default").token
    form = urllib.parse.urlencode(
        {"grant_type": "access_token", "service": login_server, "access_token": access}
    ).encode()
    request = urllib.request.Request(f"https://{login_server}/oauth2/exchange", form)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["refresh_token"]
    except urllib.error.HTTPError as err:
        raise pulumi.RunError(_exchange_refusal(login_server, err)) from None


def _exchange_refusal(login_server: str, err: Any) -> str:
    """One line for a refused token exchange: the registry's own error and the fix."""
    try:
        (first, *_) = json.loads(err.read())["errors"]
        code, message = str(first.get("code")), str(first.get("message"))
    except (ValueError, KeyError, TypeError):
        code, message = str(err.code), str(err.reason)
    where = f"imageBuilder=docker: registry {login_server} refused the push login"
    if code == "DENIED" and "not allowed access" in message:
        return (
            f"{where} ({err.code} {code}: {message.splitlines()[0]}); add this machine's public "
            "address to registryAllowedIps (pulumi config set --path 'registryAllowedIps[0]' "
            "<address>), or build with imageBuilder acr"
        )
    return f"{where} ({err.code} {code}: {message.splitlines()[0] if message else ''})"


# ---- the acr builder's run: a dynamic resource over azure-mgmt-containerregistry ------------
# Azure SDK imports stay inside functions: Pulumi pickles the provider by reference and the
# provider process imports this module on every call.


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

    # read: the run and the image it pushed stay as they were (the default keeps the state).
    # delete: the image stays in the registry, whose retention policy removes untagged
    # manifests; a stack's destroy removes the registry itself.


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


# ---- the component -----------------------------------------------------------------------


@dataclass(frozen=True)
class TrainerImageArgs:
    """Where the image goes besides its settings section: the registry (pushed once its bypass
    for tasks is on), the content tag and the commit the acr builder clones."""

    placement: Placement  # resource group, region and tags of the build task
    subscription_id: pulumi.Input[str]
    registry_name: pulumi.Input[str]
    registry_id: pulumi.Input[str]
    login_server: pulumi.Input[str]
    tag: str
    commit: str
    # A token that can read a private source_repo (a Pulumi secret; None for a public one).
    source_token: pulumi.Input[str] | None = None
    # What must be in place before the task writes to the registry (its bypass for tasks).
    registry_ready: Sequence[pulumi.Resource] = ()

    @classmethod
    def pushing_to(
        cls,
        registry: Registry,
        *,
        placement: Placement,
        subscription_id: pulumi.Input[str],
        tag: str,
        commit: str,
        source_token: pulumi.Input[str] | None,
    ) -> TrainerImageArgs:
        return cls(
            placement=placement,
            subscription_id=subscription_id,
            registry_name=registry.registry_name,
            registry_id=registry.registry_id,
            login_server=registry.login_server,
            registry_ready=[registry.task_bypass],
            tag=tag,
            commit=commit,
            source_token=source_token,
        )


class TrainerImage(pulumi.ComponentResource):
    """Builds and pushes ``<registry>/trainer:<content tag>``; ``ref`` carries the digest.

    - ``acr`` (default): a named ACR Task builds the commit on Azure; no Docker or credentials where
      ``pulumi up`` runs. The task clones the repository at the pinned commit (with a token for a
      private repository), builds on ACR's agents and pushes with its own system-assigned identity,
      which holds AcrPush on the registry: that identity is what lets the push through the
      registry's network rules (trusted services), which quick runs cannot pass. ``ImageBuild``, a
      dynamic resource, runs the task once per content tag and reads the pushed digest back; a run
      an earlier, failed ``pulumi up`` left going (or that already pushed the image) is adopted.
    - ``docker``: pulumi-docker-build with a local BuildKit; it pushes with an Entra refresh token
      for the registry (what ``az acr login --expose-token`` returns), so the admin user stays off.
    """

    ref: pulumi.Output[str]
    digest: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        image: ImageSettings,
        args: TrainerImageArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpucluster:infra:TrainerImage", name, None, opts)
        # The one reference FROM builds on (infra.toolchain.base_reference).
        build_args = {"BASE_IMAGE": base_reference(image.base, image.base_digest)}
        image_name = f"{IMAGE_REPOSITORY}:{args.tag}"
        if image.builder == "acr":
            self.digest = self._acr_build(name, image.source_repo, args, image_name, build_args)
        else:
            self.digest = self._docker_build(name, args, image_name, build_args)
        self.ref = pulumi.Output.concat(args.login_server, "/", image_name, "@", self.digest)
        self.register_outputs({"ref": self.ref, "digest": self.digest})

    def _acr_build(
        self,
        name: str,
        source_repo: str,
        args: TrainerImageArgs,
        image_name: str,
        build_args: dict[str, str],
    ) -> pulumi.Output[str]:
        """The named build task, AcrPush for its identity, and one run of it per content tag."""
        task = self._build_task(name, source_repo, args, image_name, build_args)
        push = assign_role(
            f"{name}-buildtask-acrpush",
            role=ACR_PUSH,
            principal_id=task.identity.apply(_principal_id),
            scope=args.registry_id,
            subscription_id=args.subscription_id,
            principal_type=authorization.PrincipalType.SERVICE_PRINCIPAL,
            parent=self,
        )
        build = ImageBuild(
            f"{name}-build",
            ImageBuildArgs(
                subscription_id=args.subscription_id,
                resource_group_name=args.placement.resource_group_name,
                registry_name=args.registry_name,
                task_id=task.id,
                image=image_name,
                build_args=build_args,
            ),
            # The run uses the task as updated for this tag, and pushes with the role through a
            # registry that admits tasks' identities past its firewall.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[task, push, *args.registry_ready]),
        )
        return build.digest

    def _build_task(
        self,
        name: str,
        source_repo: str,
        args: TrainerImageArgs,
        image_name: str,
        build_args: dict[str, str],
    ) -> containerregistry.Task:
        token = None
        if args.source_token is not None:
            # Stays a secret (state and plan show [secret]); an empty token means none.
            token = pulumi.Output.secret(args.source_token).apply(lambda t: t or None)
        return containerregistry.Task(
            f"{name}-build-task",
            task_name=BUILD_TASK_NAME,
            registry_name=args.registry_name,
            **args.placement.kwargs(),
            identity=containerregistry.IdentityPropertiesArgs(
                type=containerregistry.ResourceIdentityType.SYSTEM_ASSIGNED
            ),
            platform=containerregistry.PlatformPropertiesArgs(
                os=containerregistry.OS.LINUX,
                architecture=containerregistry.Architecture.AMD64,
            ),
            agent_configuration=containerregistry.AgentPropertiesArgs(cpu=BUILD_AGENT_CPUS),
            timeout=BUILD_TIMEOUT_SECONDS,
            status=containerregistry.TaskStatus.ENABLED,
            credentials=pulumi.Output.from_input(args.login_server).apply(_task_credentials),
            # No triggers: the stack runs the task, once per content tag.
            step=containerregistry.DockerBuildStepArgs(
                type="Docker",
                docker_file_path=DOCKERFILE,
                # <repo>.git#<commit> (articles/container-registry/container-registry-tasks-
                # overview.md, "Context locations"); a private repository needs the token.
                context_path=f"{source_repo}#{args.commit}",
                context_access_token=token,
                image_names=[image_name],
                is_push_enabled=True,
                no_cache=False,
                arguments=[
                    containerregistry.ArgumentArgs(name=key, value=value, is_secret=False)
                    for key, value in build_args.items()
                ],
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _docker_build(
        self, name: str, args: TrainerImageArgs, image_name: str, build_args: dict[str, str]
    ) -> pulumi.Output[str]:
        password = pulumi.Output.secret(pulumi.Output.from_input(args.login_server)).apply(
            exchange_acr_token
        )
        image = docker_build.Image(
            f"{name}-build",
            push=True,
            context=docker_build.BuildContextArgs(location=str(REPO)),
            dockerfile=docker_build.DockerfileArgs(location=str(REPO / DOCKERFILE)),
            platforms=[docker_build.Platform.LINUX_AMD64],
            build_args=build_args,
            tags=[pulumi.Output.concat(args.login_server, "/", image_name)],
            registries=[
                docker_build.RegistryArgs(
                    address=args.login_server, username=ACR_TOKEN_USER, password=password
                )
            ],
            cache_from=[
                docker_build.CacheFromArgs(
                    registry=docker_build.CacheFromRegistryArgs(
                        ref=pulumi.Output.concat(args.login_server, "/trainer:buildcache")
                    )
                )
            ],
            cache_to=[
                docker_build.CacheToArgs(
                    registry=docker_build.CacheToRegistryArgs(
                        ref=pulumi.Output.concat(args.login_server, "/trainer:buildcache"),
                        mode=docker_build.CacheMode.MAX,
                        # ACR stores cache as an OCI image manifest, not a BuildKit index.
                        image_manifest=True,
                        oci_media_types=True,
                    )
                )
            ],
            build_on_preview=False,
            opts=pulumi.ResourceOptions(parent=self),
        )
        return image.digest


@dataclass(frozen=True)
class PullSource:
    """Where the nodes pull the trainer image: the registry's login server, its ARM id (the
    one scope where their identity may pull) and the role that registry honours for pulls."""

    login_server: pulumi.Input[str]
    registry_id: pulumi.Input[str]
    pull_role: pulumi.Input[str] = ACR_PULL

    @classmethod
    def of(cls, registry: Registry) -> PullSource:
        return cls(registry.login_server, registry.registry_id)


class ReusedImage:
    """``imageRef``: an image built before, run as it is; no build, no registry of the stack's.
    ``ref`` is the reference as given and ``digest`` its digest ("" for a tag alone)."""

    def __init__(self, name: str, image: ImageSettings) -> None:
        parts = image.ref_parts
        if parts is None:  # StackSettings refuses it first; here for the type checker
            raise ConfigError(f"imageRef={image.ref}: not an image in an Azure container registry")
        if not parts["digest"]:
            # A tag can be moved to another image between the plan and a node's pull, and each
            # node pulls on its own: the nodes of one job could run different images.
            pulumi.log.warn(
                f"imageRef={image.ref}: a tag, not a digest; it can move to another image "
                "between this plan and a node's pull: pin it with @sha256:<digest>"
            )
        self.ref: pulumi.Output[str] = pulumi.Output.from_input(image.ref)
        self.digest: pulumi.Output[str] = pulumi.Output.from_input(parts["digest"] or "")
        # Another team's registry may be in the ABAC mode, where AcrPull is not honoured.
        pull = RegistryPullRole(f"{name}-pull-role", RegistryPullRoleArgs(image.registry_id))
        self.source = PullSource(parts["server"], image.registry_id, pull.role)


def _task_credentials(server: str) -> containerregistry.CredentialsArgs:
    """Trusted-services bypass for ACR Tasks (MicrosoftDocs/azure-docs, articles/container-
    registry/allow-access-trusted-services.md, "Example: ACR Tasks"): a task with a
    system-assigned identity, the default source-registry auth off (--auth-mode None), the
    identity as the registry's credential, AcrPush for it. Since June 2025 the registry must also
    opt in with networkRuleBypassAllowedForTasks=true, or the push is refused with 403
    (MicrosoftDocs/azure-management-docs, articles/container-registry/
    manage-network-bypass-policy-for-tasks.md)."""
    return containerregistry.CredentialsArgs(
        source_registry=containerregistry.SourceRegistryCredentialsArgs(
            login_mode=containerregistry.SourceRegistryLoginMode.NONE
        ),
        custom_registries={
            server: containerregistry.CustomRegistryCredentialsArgs(identity=SYSTEM_IDENTITY)
        },
    )


def _principal_id(identity: Any) -> str:
    principal = getattr(identity, "principal_id", None)
    if not principal:
        raise ValueError("the build task has no system-assigned identity to grant AcrPush")
    return principal
