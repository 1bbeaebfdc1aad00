"""The trainer image: a content-addressed tag, built and pushed by the builder the stack picks.

The tag is a hash of everything the image is built from (the Dockerfile, its lock file, the
Horovod build script, the packaging files and the trainer sources): unchanged code gives the
same tag, so Pulumi sees no change, rebuilds nothing and resubmits no job.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_docker_build as docker_build
from pulumi_azure_native import authorization, containerregistry

from infra import credentials
from infra.identity import ACR_PULL, ACR_PUSH, assign_role
from infra.image_build import BUILD_TIMEOUT_SECONDS, ImageBuild, ImageBuildArgs

# Stacks deployed before the build had a module of its own hold its provider pickled by this
# module's path (the SDK pickles a dynamic provider by reference): their refresh and destroy
# find it here.
from infra.image_build import ImageBuildProvider as ImageBuildProvider
from infra.image_inputs import DOCKERFILE, REPO
from infra.naming import Placement
from infra.registry import Registry
from infra.registry_mode import RegistryPullRole, RegistryPullRoleArgs
from infra.settings.checks import ConfigError
from infra.settings.image import ImageSettings
from infra.toolchain import base_reference

IMAGE_REPOSITORY = "trainer"
# Every build also moves this tag to what it pushed, and the pool prefetches it: each node pulls
# the image's layers while it joins, before any job, and a job's tasks (which name the content
# tag and its digest) then pull only the layers a trainer edit changed. A moving tag, because a
# pool's containerImageNames can change only while the pool has no nodes (Batch's "Update pool
# properties", Management Plane Pool - Update: all but applicationPackages, certificates,
# metadata, scaleSettings and startTask need a pool of zero nodes; read 2026-11-29): the pool
# never changes with a build. Only the speed of a pull depends on it, never what a task runs.
PREFETCH_TAG = "prefetch"
PREFETCH_IMAGE_NAME = f"{IMAGE_REPOSITORY}:{PREFETCH_TAG}"
# ACR's token exchange wants this user name with a refresh token as the password.
ACR_TOKEN_USER = "00000000-0000-0000-0000-000000000000"
BUILD_AGENT_CPUS = 8  # the ACR Task agent's CPUs; billed per CPU-second (infra/prices.py)
BUILD_TASK_NAME = "build-trainer"  # one per registry, and each stack has its own registry
# A task's credential for its own system-assigned identity, as `az acr task credential add
# --use-identity [system]` writes it (MicrosoftDocs/azure-management-docs, articles/
# container-registry/container-registry-tasks-authentication-managed-identity.md, step 4).
SYSTEM_IDENTITY = "[system]"


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


# read: the run and the image it pushed stay as they were (the default keeps the state).
# delete: the image stays in the registry, whose retention policy removes untagged
# manifests; a stack's destroy removes the registry itself.


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
    prefetch: pulumi.Output[str]  # <registry>/trainer:prefetch, moved by each build

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
        # Known at preview (no digest in it): a build must never show the pool as changing.
        self.prefetch = pulumi.Output.concat(args.login_server, "/", PREFETCH_IMAGE_NAME)
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
                image_names=[image_name, PREFETCH_IMAGE_NAME],
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
            tags=[
                pulumi.Output.concat(args.login_server, "/", tagged)
                for tagged in (image_name, PREFETCH_IMAGE_NAME)
            ],
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
    # What the pool prefetches as its nodes join (TrainerImage.prefetch) and the build that pushes
    # it, which the pool waits for (a node whose prefetch fails is unusable); none for imageRef.
    prefetch: pulumi.Input[str] | None = None
    pushed_by: pulumi.Resource | None = None

    @classmethod
    def of(cls, registry: Registry, image: TrainerImage) -> PullSource:
        return cls(
            registry.login_server, registry.registry_id, prefetch=image.prefetch, pushed_by=image
        )


class ReusedImage:
    """``imageRef``: an image built before, run as it is; no build, no registry of the stack's.
    ``ref`` is the reference as given and ``digest`` its digest ("" for a tag alone). The pool
    prefetches nothing for it: a new imageRef would change the pool, which Batch accepts only
    while the pool has no nodes (see PREFETCH_TAG); the first task on a node pulls it."""

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
