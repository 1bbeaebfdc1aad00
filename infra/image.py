"""The trainer image: a content-addressed tag, built and pushed by the builder the stack picks.

The tag is a hash of everything the image is built from (the Dockerfile, its lock file, the
Horovod build script, the packaging files and the trainer sources): unchanged code gives the
same tag, so Pulumi sees no change, rebuilds nothing and resubmits no job. Builders:

- ``acr`` (default): an ACR Task builds the commit on Azure; no Docker or credentials where
  ``pulumi up`` runs. The registry pulls the build context from git at the pinned commit.
- ``docker``: pulumi-docker-build with a local BuildKit; it pushes with an Entra refresh token
  for the registry (what ``az acr login --expose-token`` returns), so the admin user stays off.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_docker_build as docker_build
from pulumi_azure_native import containerregistry

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = "docker/Dockerfile"
IMAGE_REPOSITORY = "trainer"
# What the image is built from; .dockerignore admits exactly these (tests/docker checks it).
IMAGE_INPUTS = (
    DOCKERFILE,
    "docker/requirements.txt",
    "scripts/build_horovod.sh",
    "pyproject.toml",
    "README.md",
    "trainer",
)
# ACR's token exchange wants this user name with a refresh token as the password.
ACR_TOKEN_USER = "00000000-0000-0000-0000-000000000000"
BUILD_TIMEOUT_SECONDS = 7200  # Horovod's NCCL build dominates


def content_tag(root: Path = REPO) -> str:
    """A 16-hex-digit hash of the image inputs' paths and bytes (caches and bytecode excluded)."""
    digest = hashlib.sha256()
    for entry in IMAGE_INPUTS:
        path = root / entry
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            relative = file.relative_to(root).as_posix()
            if "__pycache__" in relative or relative.endswith(".pyc"):
                continue
            digest.update(relative.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def source_commit(root: Path = REPO) -> tuple[str, bool]:
    """(HEAD commit, whether the image inputs differ from it): an ACR Task builds the commit,
    so uncommitted changes would not be in the image that carries their hash."""
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    status = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--", *IMAGE_INPUTS],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return head, bool(status.strip())


def exchange_acr_token(login_server: str) -> str:
    """An ACR refresh token for the caller's Entra identity (as ``az acr login --expose-token``)."""
    from azure.identity import DefaultAzureCredential

    credential = DefaultAzureCredential()
    access = credential.get_token("https://management.azure.com/.default").token
    form = urllib.parse.urlencode(
        {"grant_type": "access_token", "service": login_server, "access_token": access}
    ).encode()
    request = urllib.request.Request(f"https://{login_server}/oauth2/exchange", form)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["refresh_token"]


@dataclass(frozen=True)
class TrainerImageArgs:
    builder: str  # "acr" or "docker"
    registry_name: pulumi.Input[str]
    login_server: pulumi.Input[str]
    resource_group_name: pulumi.Input[str]
    base_image: str
    base_digest: str  # "" builds from the tag; "sha256:..." pins it
    source_repo: str  # git URL for the acr builder
    tag: str
    commit: str


class TrainerImage(pulumi.ComponentResource):
    """Builds and pushes ``<registry>/trainer:<content tag>``; ``ref`` carries the digest."""

    ref: pulumi.Output[str]
    digest: pulumi.Output[str]

    def __init__(
        self, name: str, args: TrainerImageArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:TrainerImage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        build_args = {"BASE_IMAGE": args.base_image, "BASE_DIGEST": args.base_digest}
        image_name = f"{IMAGE_REPOSITORY}:{args.tag}"
        if args.builder == "acr":
            run = containerregistry.TaskRun(
                f"{name}-build",
                resource_group_name=args.resource_group_name,
                registry_name=args.registry_name,
                # A new tag (new content) re-runs the build; the same tag changes nothing.
                force_update_tag=args.tag,
                run_request=containerregistry.DockerBuildRequestArgs(
                    type="DockerBuildRequest",
                    docker_file_path=DOCKERFILE,
                    source_location=f"{args.source_repo}#{args.commit}",
                    platform=containerregistry.PlatformPropertiesArgs(
                        os=containerregistry.OS.LINUX,
                        architecture=containerregistry.Architecture.AMD64,
                    ),
                    image_names=[image_name],
                    is_push_enabled=True,
                    timeout=BUILD_TIMEOUT_SECONDS,
                    agent_configuration=containerregistry.AgentPropertiesArgs(cpu=8),
                    arguments=[
                        containerregistry.ArgumentArgs(name=key, value=value, is_secret=False)
                        for key, value in build_args.items()
                    ],
                ),
                opts=child,
            )
            self.digest = run.run_result.apply(_task_digest)
        else:
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
                opts=child,
            )
            self.digest = image.digest
        self.ref = pulumi.Output.concat(args.login_server, "/", image_name, "@", self.digest)
        self.register_outputs({"ref": self.ref, "digest": self.digest})


def _task_digest(result: containerregistry.outputs.RunResponse) -> str:
    images = result.output_images or []
    if result.status != "Succeeded" or not images or not images[0].digest:
        raise ValueError(
            f"image build run {result.run_id} ended {result.status}: {result.run_error_message}"
        )
    return images[0].digest
