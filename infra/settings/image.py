"""The image's section: how the trainer image is built and on which base, or the existing image
(``imageRef``) the nodes pull instead, each field checked here. Whether the registry admits the
machine that pushes is a rule across sections (``infra.settings.rules``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from infra.settings.checks import ConfigError
from infra.settings.schema import setting
from infra.toolchain import (
    APT_FAMILIES,
    BASE_IMAGE,
    BASE_OS,
    BASE_PYTHON,
    CUDA,
    cuda_of_base,
    os_of_base,
)

IMAGE_BUILDERS = ("acr", "docker")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_GIT_URL = re.compile(r"^https://[^\s#]+\.git$")
# [registry[:port]/]repository:tag; Docker Hub's official images have no namespace (debian:13-slim).
_IMAGE_REF = re.compile(r"^([a-z0-9.-]+(:[0-9]+)?/)?[a-z0-9._/-]+:[A-Za-z0-9._-]+$")
# An image in an Azure container registry: <name>.azurecr.io/<repository>[:<tag>][@<digest>]
# (registry names: 5-50 letters and digits; login servers are lowercase).
_ACR_IMAGE = re.compile(
    r"^(?P<server>(?P<registry>[a-z0-9]{5,50})\.azurecr\.io)/"
    r"(?P<repository>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
_REGISTRY_ID = re.compile(
    r"^/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[^/]+/providers/"
    r"Microsoft\.ContainerRegistry/registries/(?P<name>[A-Za-z0-9]{5,50})$",
    re.IGNORECASE,
)


def acr_image(ref: str) -> re.Match[str] | None:
    """``ref`` split into server, registry, repository, tag and digest; None for a reference
    outside an Azure container registry."""
    return _ACR_IMAGE.match(ref)


@dataclass(frozen=True, kw_only=True)
class ImageSettings:
    """How the trainer image is built, and on which base."""

    builder: str = setting(
        "imageBuilder",
        "acr",
        "How the trainer image is built and pushed - acr (an ACR Task builds the commit on "
        "Azure; no local Docker) or docker (local BuildKit with pulumi-docker-build, pushing "
        "with an Entra token).",
    )
    # Unset, ``StackSettings.from_mapping`` puts the checkout's origin here, which the acr
    # builder clones.
    source_repo: str = setting(
        "imageSourceRepo",
        "",
        "Git URL of this repository (https://.../<repo>.git) that the acr builder clones at the "
        "deployed commit; empty means the checkout's origin remote (an ssh origin becomes its "
        "https URL).",
    )
    base: str = setting(
        "imageBase",
        BASE_IMAGE,
        "Base of both stages of the trainer image - Debian 13 (Python 3.13 from its archive); "
        "torch 2.13.0's own wheels bring CUDA 13.0, so no CUDA base is needed "
        "(infra/toolchain.py).",
    )
    base_digest: str = setting(
        "imageBaseDigest",
        "",
        "sha256 digest that pins imageBase (docker buildx imagetools inspect <imageBase>); the "
        "image then builds from <imageBase>@<digest>. Empty builds from the tag alone.",
    )
    ref: str = setting(
        "imageRef",
        "",
        "An existing trainer image to run instead of building one - "
        "<name>.azurecr.io/<repository>@sha256:<digest> (a tag instead of the digest is "
        "accepted with a warning; it can move). Set, the stack builds nothing and creates no "
        "registry; the nodes pull it with their identity, granted on imageRegistryId alone the "
        "pull role its mode honours (AcrPull, or Container Registry Repository Reader in the "
        "ABAC repository-permissions mode, read at pulumi up). Empty builds the image.",
    )
    registry_id: str = setting(
        "imageRegistryId",
        "",
        "ARM resource id of the registry holding imageRef (az acr show -n <name> --query id -o "
        "tsv), where the deployer may read it and assign roles; its network rules must admit "
        "the pool's NAT address. Required with imageRef, empty otherwise.",
    )

    @property
    def ref_parts(self) -> re.Match[str] | None:
        return acr_image(self.ref)

    @property
    def builds(self) -> bool:
        """The stack builds the image (neither imageRef nor imageRegistryId is set)."""
        return not (self.ref or self.registry_id)

    def check(self) -> None:
        if self.builder not in IMAGE_BUILDERS:
            raise ConfigError(f"imageBuilder={self.builder!r}: use {' or '.join(IMAGE_BUILDERS)}")
        if self.builds:
            self._check_build()
        else:
            self._check_ref()  # nothing is built: the build settings do not matter

    def _check_build(self) -> None:
        if self.builder == "acr" and not _GIT_URL.match(self.source_repo):
            raise ConfigError(
                f"imageSourceRepo={self.source_repo!r}: the acr builder clones this "
                "repository and no https or ssh origin remote says where it is; give its "
                "https://.../<name>.git URL (or use imageBuilder docker)"
            )
        if not _IMAGE_REF.match(self.base):
            raise ConfigError(
                f"imageBase={self.base!r}: give [<registry>/]<repository>:<tag>, "
                f"for example {BASE_IMAGE}"
            )
        cuda = cuda_of_base(self.base)
        if cuda is not None and cuda != CUDA:
            raise ConfigError(
                f"imageBase={self.base}: CUDA {cuda}, but torch's wheel is built for CUDA "
                f"{CUDA}; use {BASE_IMAGE} (torch's wheels bring CUDA)"
            )
        base_os = os_of_base(self.base)
        if base_os is not None and base_os != BASE_OS:
            manager = "apt" if base_os.startswith(APT_FAMILIES) else "apt, which it does not have"
            raise ConfigError(
                f"imageBase={self.base}: a {base_os} image, but the trainer image installs "
                f"{BASE_OS}'s packages with {manager} ({BASE_PYTHON}, the InfiniBand user space: "
                f"docker/Dockerfile); use a {BASE_OS} base such as {BASE_IMAGE}"
            )
        if self.base_digest and not _DIGEST.match(self.base_digest):
            raise ConfigError(
                f"imageBaseDigest={self.base_digest!r}: give sha256:<64 hex digits> "
                "(docker buildx imagetools inspect <imageBase>) or leave it empty"
            )

    def _check_ref(self) -> None:
        """An image the nodes can pull with their managed identity: only an Azure container
        registry accepts it (Batch ContainerRegistry.identityReference, "to access an Azure
        Container Registry instead of username and password"), and only a registry whose id
        is given can get the AcrPull grant, at its own scope."""
        parts = self.ref_parts
        if not self.ref:
            raise ConfigError(
                f"imageRegistryId={self.registry_id}: set without imageRef; set imageRef to "
                "an image in that registry, or leave both empty to build the image"
            )
        if parts is None:
            raise ConfigError(
                f"imageRef={self.ref}: give <name>.azurecr.io/<repository>@sha256:<digest>; the "
                "nodes pull with their managed identity, which only an Azure container registry "
                "accepts"
            )
        if not parts["tag"] and not parts["digest"]:
            raise ConfigError(
                f"imageRef={self.ref}: neither a digest nor a tag names the image; append "
                "@sha256:<digest> (az acr repository show -n <registry> --image <repo>:<tag>)"
            )
        registry = _REGISTRY_ID.match(self.registry_id)
        if registry is None or registry["name"].lower() != parts["registry"]:
            raise ConfigError(
                f"imageRegistryId={self.registry_id or '(empty)'}: imageRef's registry "
                f"{parts['registry']} needs its ARM id, where the nodes get AcrPull; set it to "
                f"`az acr show -n {parts['registry']} --query id -o tsv`"
            )
