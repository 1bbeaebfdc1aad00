"""The options of an acceptance run (from its flags, and what it looks up on this machine) and the
throwaway stack's config they make: the profile's settings, budget included, validated as
``pulumi up`` would validate them."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml

from dt_commands.acceptance.errors import InputError, Unavailable
from dt_commands.acceptance.host import Host, reused_registry
from dt_commands.acceptance.profiles import PROFILES, Profile
from infra import cost
from infra.image_inputs import git_https_url
from infra.naming import PROJECT
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from infra.settings.values import REPO, load_schema
from infra.sizes import CPU_ACCEPTANCE, SUPPORTED
from trainer.checkpoints.cadence import checkpoint_steps


@dataclass(frozen=True)
class Options:
    profile: Profile
    stack_name: str
    location: str
    vm_size: str
    budget_email: str
    image_builder: str
    image_source_repo: str
    ssh_public_key: str
    client_ip: str | None  # this machine's public IP, admitted to storage (and the registry)
    keep_on_failure: bool = False
    secrets_provider: str | None = None
    image_source_token: str | None = None  # read from --image-source-token-env, never argv
    image_ref: str = ""  # --image-ref: run this image, build none
    image_registry_id: str = ""  # its registry's ARM id (az acr show), where AcrPull goes
    # Settings a dry run could not look up: key -> what a real run uses instead.
    placeholders: Mapping[str, str] = field(default_factory=dict)


def stack_name(profile: str, now: datetime | None = None) -> str:
    """``acceptance-<profile>-<UTC time>``: a new stack every run."""
    moment = now or datetime.now(UTC)
    return f"acceptance-{profile}-{moment.strftime('%Y%m%d-%H%M%S')}"


def throwaway_ssh_key() -> str:
    """An OpenSSH public key whose private half is never kept: the NFS VM needs a key and
    nobody logs in to an acceptance stack's server. ``cryptography`` comes with
    azure-identity (through msal)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.generate().public_key()
    text = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{text.decode()} acceptance-throwaway"


def stack_values(opts: Options) -> dict[str, Any]:
    """The profile's stack config (short camelCase keys), budget included."""
    profile = opts.profile
    values: dict[str, Any] = {
        "team": "acceptance",  # with a stack named acceptance-*: names are the stack name
        "costCenter": "acceptance",
        "location": opts.location,
        "vmSize": opts.vm_size,
        "nodeCount": profile.node_count,
        "scaleMode": profile.scale_mode,
        "idleMinutes": 10,
        "nfsMode": "vm",
        "nfsVmSize": "Standard_D2s_v5",
        "nfsDiskCount": 1,
        "nfsDiskSizeGb": 32,
        "sshPublicKey": opts.ssh_public_key,
        "storageAllowedIps": [opts.client_ip] if opts.client_ip else [],
        "registryAllowedIps": (
            [opts.client_ip] if opts.client_ip and opts.image_builder == "docker" else []
        ),
        "logRetentionDays": 30,
        "protectData": False,  # destroy removes everything
        "budgetEmails": [opts.budget_email],
        "imageBuilder": opts.image_builder,
        "imageSourceRepo": opts.image_source_repo,
        "submitJob": True,
        "trainerConfig": profile.trainer_config,
        "acceptanceProfile": profile.name,
    }
    if opts.image_ref:  # nothing to build: the build settings stay out of the stack
        del values["imageBuilder"], values["imageSourceRepo"]
        values.update(imageRef=opts.image_ref, imageRegistryId=opts.image_registry_id)
    values["budget"] = _budget_for(opts.stack_name, values)
    return values


def _budget_for(name: str, values: dict[str, Any]) -> int:
    """A monthly budget above the stack's own monthly estimate (the policy pack requires one
    that covers it), rounded up to USD 100."""
    settings = StackSettings.from_mapping(name, {**values, "budget": 0}, load_schema())
    monthly = cost.total(cost.monthly_cost(settings.cost_inputs()))
    return int(math.ceil(monthly * 1.25 / 100) * 100)


def validated(opts: Options, values: dict[str, Any]) -> StackSettings:
    try:
        return StackSettings.from_mapping(opts.stack_name, values, load_schema())
    except ConfigError as err:
        raise InputError(str(err)) from None


def config_map(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as Automation API config for ``set_all_config(..., path=True)``: one
    ``gpu-cluster:<key>`` per scalar, ``<key>[i]`` per list element (what
    ``pulumi config set --path`` stores as a list, which the schema's array type needs)."""
    from pulumi.automation import ConfigValue

    out: dict[str, Any] = {}
    for key, value in values.items():
        items = list(enumerate(value)) if isinstance(value, list | tuple) else [(None, value)]
        for index, item in items:
            name = f"{PROJECT}:{key}" + ("" if index is None else f"[{index}]")
            text = str(item).lower() if isinstance(item, bool) else str(item)
            out[name] = ConfigValue(value=text)
    return out


def expected_checkpoints(trainer_config: str) -> list[int]:
    """The steps the preset's run checkpoints at, by the trainer's own rule: every
    checkpoint_every steps and the last (the presets' one epoch outlasts max_steps)."""
    settings = yaml.safe_load((REPO / trainer_config).read_text(encoding="utf-8"))
    every, last = int(settings.get("checkpoint_every") or 0), int(settings["max_steps"])
    return checkpoint_steps(every, last)


def resolve_options(args: argparse.Namespace, host: Host, *, look_up: bool) -> Options:
    """The options of a run. Without ``look_up`` (a dry run, or the input check before the
    prerequisites) nothing is asked of az or the internet: placeholders stand in, named as
    such; with it, git, az and the internet are asked, failing before anything is created."""
    profile = PROFILES[args.profile]
    vm_size = _vm_size(profile, args.vm_size or profile.vm_size)
    image_ref, registry_id = args.image_ref or "", ""
    placeholders = {}
    if image_ref:
        registry_id = reused_registry(image_ref, host, look_up=look_up)
        if not look_up:
            placeholders["imageRegistryId"] = "placeholder: a real run asks az acr show"
    builds = args.image_builder == "acr" and not image_ref  # the acr builder clones a repo
    repo = _source_repo(args.image_source_repo, host, look_up) if builds else args.image_source_repo
    email, client_ip = args.budget_email, args.client_ip
    if email is None and look_up:
        email = _account_email(host)
    if client_ip is None and look_up:
        client_ip = _public_ip(host)
    if email is None:
        placeholders["budgetEmails"] = "placeholder: a real run alerts your az login's e-mail"
    if repo is None and builds:
        placeholders["imageSourceRepo"] = "placeholder: a real run reads the origin remote"
    token = None
    if args.image_source_token_env:
        token = host.env.get(args.image_source_token_env)
        if not token:
            raise InputError(f"--image-source-token-env={args.image_source_token_env}: not set")
    return Options(
        profile=profile,
        stack_name=stack_name(profile.name),
        location=args.location,
        vm_size=vm_size,
        # Placeholders for the dry run only, shown as such in its config listing.
        budget_email=email or "you@example.com",
        image_builder=args.image_builder,
        image_source_repo=repo or "https://github.com/<your-org>/<repo>.git",
        ssh_public_key=throwaway_ssh_key(),
        client_ip=client_ip,
        keep_on_failure=args.keep_on_failure,
        secrets_provider=args.secrets_provider,
        image_source_token=token,
        image_ref=image_ref,
        image_registry_id=registry_id,
        placeholders=placeholders,
    )


def _vm_size(profile: Profile, vm_size: str) -> str:
    """``--vm-size`` (or the profile's), if the profile runs on it."""
    if profile.name == "cpu" and vm_size not in CPU_ACCEPTANCE:
        raise InputError(
            f"--vm-size={vm_size}: the cpu profile runs on {', '.join(CPU_ACCEPTANCE)}"
        )
    if profile.name == "gpu" and vm_size not in SUPPORTED:
        raise InputError(
            f"--vm-size={vm_size}: the gpu profile needs an InfiniBand GPU size, one of "
            f"{', '.join(SUPPORTED)}"
        )
    return vm_size


def _source_repo(given: str | None, host: Host, look_up: bool) -> str | None:
    """The repository the acr builder clones: ``--image-source-repo``, else the origin remote."""
    if given is not None:
        return given
    remote = host.run(["git", "-C", str(REPO), "remote", "get-url", "origin"])
    repo = git_https_url(remote.stdout) if remote.returncode == 0 else None
    if repo is None and look_up:
        raise InputError(
            "--image-source-repo: the acr builder clones this repository and no https or "
            "ssh `origin` remote says where it is; pass https://.../<repo>.git"
        )
    return repo


def _account_email(host: Host) -> str:
    """The signed-in az account's e-mail address, which the stack's budget alerts."""
    account = host.run(["az", "account", "show", "--query", "user.name", "-o", "tsv"])
    email = account.stdout.strip()
    if account.returncode != 0 or "@" not in email:
        raise InputError(
            "--budget-email: the signed-in az account has no e-mail address "
            f"({email or 'none'}); pass the address the stack's budget alerts"
        )
    return email


def _public_ip(host: Host) -> str:
    try:
        return host.public_ip()
    except OSError as err:
        raise Unavailable(
            f"cannot look up this machine's public IP ({err}): pass --client-ip"
        ) from None
