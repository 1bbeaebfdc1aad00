"""What an acceptance run asks of this machine (``Host``: tests pass fakes): the Pulumi and Azure
CLIs logged in, its public IP, a committed source for the acr builder, and for ``--image-ref``
the registry it names and whether this login may grant the nodes AcrPull there."""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dt_commands.acceptance.errors import InputError, Unavailable
from infra.settings.image import acr_image
from trainer.common.errors import one_line


def run_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return subprocess.CompletedProcess(argv, 127, "", str(err))


def _public_ip() -> str:
    """This machine's public IPv4 address as the internet sees it (what a storage IP rule
    matches)."""
    with urllib.request.urlopen("https://api.ipify.org", timeout=15) as response:
        return response.read().decode().strip()


def _check_source() -> None:
    """The acr builder builds the deployed commit: refuse uncommitted or unpushed image inputs
    now (``ConfigError``), as `pulumi up` would, before anything is created."""
    from infra.image_source import commit_to_build

    commit_to_build(strict=True)


@dataclass(frozen=True)
class Host:
    """What a real run asks of this machine; tests pass fakes."""

    which: Callable[[str], str | None] = shutil.which
    run: Callable[[list[str]], subprocess.CompletedProcess[str]] = run_command
    public_ip: Callable[[], str] = _public_ip
    check_source: Callable[[], None] = _check_source
    env: Mapping[str, str] = field(default_factory=dict)


def prerequisites(host: Host, secrets_provider: str | None) -> None:
    """The Pulumi CLI logged in (with a way to encrypt the stack's secrets on a self-managed
    backend) and an Azure CLI login; raises ``Unavailable`` with the fix."""
    if host.which("pulumi") is None:
        raise Unavailable(
            "the Pulumi CLI is not on PATH: install it (https://www.pulumi.com/docs/install/), "
            "then pulumi login"
        )
    whoami = host.run(["pulumi", "whoami", "--json"])
    if whoami.returncode != 0:
        raise Unavailable(
            "pulumi is not logged in to a state backend: run pulumi login (Pulumi Cloud or "
            "azblob://<container>?storage_account=<account>)"
        )
    try:
        backend = str(json.loads(whoami.stdout).get("url", ""))
    except ValueError:
        backend = ""
    self_managed = not backend.startswith("https://")
    passphrase = host.env.get("PULUMI_CONFIG_PASSPHRASE") is not None or bool(
        host.env.get("PULUMI_CONFIG_PASSPHRASE_FILE")
    )
    if self_managed and not secrets_provider and not passphrase:
        raise Unavailable(
            f"the state backend {backend or '(self-managed)'} encrypts stack secrets with a "
            "passphrase: set PULUMI_CONFIG_PASSPHRASE (or _FILE), or pass --secrets-provider "
            "azurekeyvault://<vault>.vault.azure.net/keys/<key>"
        )
    if host.which("az") is None:
        raise Unavailable("the Azure CLI (az) is not on PATH: install it, then az login")
    if host.run(["az", "account", "show", "-o", "none"]).returncode != 0:
        raise Unavailable("az is not logged in: run az login (and az account set -s <id>)")


ASSIGN_ROLES = "Microsoft.Authorization/roleAssignments/write"
# ARM's Permissions - List For Resource: the caller's actions and notActions at a scope, one
# entry per role it holds there (REST reference, authorization/permissions, 2022-04-01).
PERMISSIONS_API = "providers/Microsoft.Authorization/permissions?api-version=2022-04-01"
PLACEHOLDER_SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"


def may_assign_roles(permissions: list[Mapping[str, Any]]) -> bool:
    """Whether one of the caller's roles at a scope grants ``roleAssignments/write`` through an
    action pattern (``*`` wildcards, case-insensitive) that its own notActions do not take
    back: Contributor's ``Microsoft.Authorization/*/Write`` does. Deny assignments and role
    conditions are not in this answer: ARM may still refuse what it allows."""

    def granted(patterns: Any) -> bool:
        return any(
            fnmatch.fnmatchcase(ASSIGN_ROLES.lower(), str(p).lower()) for p in patterns or ()
        )

    return any(granted(p.get("actions")) and not granted(p.get("notActions")) for p in permissions)


def reused_registry(image_ref: str, host: Host, *, look_up: bool) -> str:
    """The ARM id of ``--image-ref``'s registry, where the nodes' identity will get AcrPull;
    ``InputError`` (exit 2, nothing created) for a ref without a digest, outside ACR, in a
    registry az cannot find, or one where this login may not assign roles. Without
    ``look_up``, a placeholder id."""
    parts = acr_image(image_ref)
    if parts is None or not parts["digest"]:
        raise InputError(
            f"--image-ref={image_ref}: give <name>.azurecr.io/<repository>@sha256:<digest>; the "
            "check holds a run to one image, which only a digest names"
        )
    name = parts["registry"]
    if not look_up:
        return (
            f"/subscriptions/{PLACEHOLDER_SUBSCRIPTION}/resourceGroups/placeholder/providers/"
            f"Microsoft.ContainerRegistry/registries/{name}"
        )
    shown = host.run(["az", "acr", "show", "-n", name, "--query", "id", "-o", "tsv"])
    registry_id = shown.stdout.strip()
    if shown.returncode != 0 or not registry_id:
        raise InputError(
            f"--image-ref={image_ref}: az acr show -n {name} finds no registry this login can "
            f"read in the selected subscription ({one_line(shown.stderr.strip()[:160])}); use "
            "an image in a registry of this subscription"
        )
    url = f"https://management.azure.com{registry_id}/{PERMISSIONS_API}"
    answer = host.run(["az", "rest", "--method", "get", "--url", url])
    try:
        permissions = json.loads(answer.stdout)["value"]
    except (ValueError, KeyError, TypeError):
        permissions = []
    if answer.returncode != 0 or not may_assign_roles(permissions):
        raise InputError(
            f"--image-ref={image_ref}: this login may not assign roles on registry {name} "
            f"({ASSIGN_ROLES}), so the nodes could not get AcrPull there; ask for Role Based "
            "Access Control Administrator (or User Access Administrator) on it, or use an "
            "image in a registry you may grant"
        )
    return registry_id
