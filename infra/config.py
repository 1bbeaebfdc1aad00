"""The stack's settings: frozen dataclasses built and validated by a pure ``from_mapping``.

Each section field declares its stack setting once (key, default, description: ``infra.schema``);
``python -m infra.config --write`` writes Pulumi.yaml's ``config:`` block from them. Every bad
value raises ``ConfigError`` naming the key, the value and the fix, before anything is declared.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml

from infra.code_snapshot import CodeSnapshot, SnapshotError, snapshot
from infra.cost import CostInputs
from infra.image_inputs import origin_clone_url
from infra.ip_rules import ip_rule_problem
from infra.naming import PROJECT, default_tags, tag_problem
from infra.runnable import missing, what_runs
from infra.schema import declared, notes_of, render_block, schema_of, setting, with_block
from infra.sizes import CPU_ACCEPTANCE, NOT_YET, RETIRED, SUPPORTED, GpuSize, size_of
from infra.toolchain import APT_FAMILIES, BASE_OS, CUDA, cuda_of_base, os_of_base
from infra.trainer_command import DEFAULT_SCRIPT_ENGINE, SCRIPT_ENGINES, script_argv
from infra.trainer_settings import TrainerSettings, TrainerSettingsError
from trainer.common.errors import OneLineValueError
from trainer.settings.choices import is_plugin_ref

PROJECT_FILE = Path(__file__).resolve().parent.parent / "Pulumi.yaml"
SCALE_MODES = ("fixed", "autoscale")
# The most nodes a pool or a job takes (nodeCount, jobs.<name>.nodes, a sweep's --nodes).
MAX_NODES = 100
NFS_MODES = ("vm", "azurefiles")
IMAGE_BUILDERS = ("acr", "docker")
# "" for team stacks; the throwaway stacks of python -m dt_commands.acceptance say which profile.
ACCEPTANCE_PROFILES = ("", "cpu", "gpu")
REPO = PROJECT_FILE.parent
PRINCIPAL_TYPES = ("User", "Group", "ServicePrincipal")
_TEAM = re.compile(r"^[a-z][a-z0-9]{1,11}$")
_SSH_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]{40,}( .*)?$"
)
_MONTH = re.compile(r"^20\d\d-(0[1-9]|1[0-2])$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_GIT_URL = re.compile(r"^https://[^\s#]+\.git$")
# [registry[:port]/]repository:tag; Docker Hub's official images have no namespace (ubuntu:22.04).
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
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,200}$")
_GUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
# Pulumi.yaml has no object type: a map setting is declared with a plain `value:` default.
_S = TypeVar("_S")
_SCHEMA_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}
_JOB_NAME = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
JOB_KEYS = (
    "trainerConfig",
    "command",
    "engine",
    "code",
    "nodes",
    "datasetPrefix",
    "priority",
    "maxWallClockHours",
)
# A job that has not ended a week after its creation (waiting for nodes, or wedged below what
# the watchdog sees) is stopped by Batch; a job may set its own (0: no limit).
DEFAULT_WALL_CLOCK_HOURS = 168
MAX_WALL_CLOCK_HOURS = 8760  # a year
SHORTHAND_JOB = "default"  # the one job of submitJob/trainerConfig/datasetPrefix


def acr_image(ref: str) -> re.Match[str] | None:
    """``ref`` split into server, registry, repository, tag and digest; None for a reference
    outside an Azure container registry."""
    return _ACR_IMAGE.match(ref)


class ConfigError(OneLineValueError):
    """A stack setting is invalid (apart from the trainer's own ConfigError, which a job's
    trainer file raises and the stack names with its key)."""


def load_schema(path: Path = PROJECT_FILE) -> dict[str, dict[str, Any]]:
    """The ``config:`` schema of Pulumi.yaml keyed by short name (``vmSize``)."""
    project = yaml.safe_load(path.read_text(encoding="utf-8"))
    prefix = f"{project['name']}:"
    return {key.removeprefix(prefix): spec for key, spec in project["config"].items()}


@dataclass(frozen=True, kw_only=True)
class NetworkSettings:
    """The VNet and its subnets, and the public addresses storage and the registry admit."""

    vnet_cidr: str = setting(
        "vnetCidr", "10.20.0.0/16", "Private address space of the virtual network."
    )
    compute_subnet_cidr: str = setting(
        "computeSubnetCidr", "10.20.0.0/20", "Subnet of the GPU nodes, inside vnetCidr."
    )
    storage_subnet_cidr: str = setting(
        "storageSubnetCidr", "10.20.16.0/24", "Subnet of the NFS server, inside vnetCidr."
    )
    storage_allowed_ips: tuple[str, ...] = setting(
        "storageAllowedIps",
        (),
        "Public IPs, or CIDRs from /16 to /30 (no private ranges), of machines that upload "
        "datasets and read logs from the data storage account (dt-data upload, job_log_url); "
        "the VNet's subnets are always allowed.",
    )
    registry_allowed_ips: tuple[str, ...] = setting(
        "registryAllowedIps",
        (),
        "Public IPs or CIDRs no wider than /16 (no private ranges) of build machines allowed to "
        "reach the registry; nodes are allowed through the NAT gateway.",
    )

    @property
    def nfs_server_ip(self) -> str:
        """The NFS server's static address: the first host Azure does not reserve."""
        return str(ipaddress.ip_network(self.storage_subnet_cidr)[4])


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """The Batch pool: its size and scaling, and who besides the deployer submits jobs."""

    vm_size: str = setting(
        "vmSize",
        "Standard_ND96isr_H100_v5",
        "InfiniBand GPU VM size of the pool (see infra/sizes.py).",
    )
    node_count: int = setting(
        "nodeCount",
        2,
        "Dedicated nodes (fixed scale) or the most dedicated nodes autoscale starts (1-100).",
    )
    # Spot through Batch's low-priority fields (``infra.cluster.scale_settings``): the whole
    # pool, never beside dedicated nodes (``StackSettings._check_spot``).
    spot: bool = setting(
        "spot",
        False,
        "Make the pool's nodeCount nodes Spot instead of dedicated: billed at Spot's variable "
        "rate (at most pay-as-you-go; Batch sets no max price), evictable at any time with 30 s "
        "notice at best, billed while evicted nodes are still powered on (docs/jobs.md, Spot "
        "nodes). Needs checkpointing; needs the account's Spot core quota.",
    )
    scale_mode: str = setting(
        "scaleMode",
        "autoscale",
        "fixed, or autoscale (starts nodes for queued tasks, to zero when idle).",
    )
    idle_minutes: int = setting(
        "idleMinutes", 15, "Minutes without tasks before autoscale removes every node."
    )
    os_disk_size_gb: int = setting(
        "osDiskSizeGb",
        128,
        "OS disk of each pool node in GB (64..4095; the HPC image's own disk is 64 GB, about 45 "
        "GB of it used, and the trainer image is pulled onto it).",
    )
    checkpointing: bool = setting(
        "checkpointing",
        True,
        "Training checkpoints to shared storage; recorded on the pool as metadata checkpointing.",
    )
    # Jobs that wait for a debugger (debug_rank) may run on a production stack (policy pack).
    allow_debugger: bool = setting(
        "allowDebugger",
        False,
        "Allow jobs whose trainer settings set debug_rank (a rank that waits for a debugger, "
        "the other ranks with it) on a production stack (named prod or production, or ending in "
        "-prod or -production), where the policy pack refuses them otherwise; the pool then "
        "carries metadata debugger=allowed.",
    )
    job_submitter_object_id: str = setting(
        "jobSubmitterObjectId",
        "",
        "Entra object id of the team (a group is best) granted, besides whoever runs pulumi "
        "up, who always gets them, Batch Job Submitter and Storage Blob Data Reader on the logs "
        "and outputs containers (what dt-jobs reads); empty grants the deployer only, which a "
        "stack that CI (a service principal) deploys jobs from refuses.",
    )
    job_submitter_type: str = setting(
        "jobSubmitterType",
        "Group",
        "Kind of jobSubmitterObjectId - Group, User or ServicePrincipal (ARM refuses a wrong "
        "one). The deployer's kind is looked up by Azure.",
    )

    @property
    def gpu(self) -> GpuSize:
        """The pool's size: an InfiniBand GPU size, or (acceptance profile cpu only) the CPU
        acceptance size, whose ``gpus`` and ``ib_ports`` are 0."""
        return size_of(self.vm_size)


@dataclass(frozen=True, kw_only=True)
class NfsSettings:
    """The shared file system: an NFS server VM or an Azure Files NFS share."""

    mode: str = setting(
        "nfsMode",
        "vm",
        "vm (a Linux NFS server with RAID0 premium disks) or azurefiles (premium NFS 4.1 share).",
    )
    vm_size: str = setting("nfsVmSize", "Standard_D16s_v5", "VM size of the NFS server.")
    disk_count: int = setting(
        "nfsDiskCount", 4, "Premium data disks striped (RAID0) on the NFS server."
    )
    disk_size_gb: int = setting("nfsDiskSizeGb", 1024, "Size of each NFS data disk in GiB.")
    share_quota_gb: int = setting(
        "nfsShareQuotaGb", 1024, "Quota of the Azure Files NFS share in GiB (nfsMode azurefiles)."
    )
    ssh_public_key: str = setting(
        "sshPublicKey",
        "",
        "OpenSSH public key for the NFS server's admin user (no passwords are set).",
    )


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
    # Unset, ``from_mapping`` puts the checkout's origin here, which the acr builder clones.
    source_repo: str = setting(
        "imageSourceRepo",
        "",
        "Git URL of this repository (https://.../<repo>.git) that the acr builder clones at the "
        "deployed commit; empty means the checkout's origin remote (an ssh origin becomes its "
        "https URL).",
    )
    base: str = setting(
        "imageBase",
        "ubuntu:22.04",
        "Base of both stages of the trainer image - Ubuntu 22.04 (Python 3.11 from its "
        "archive); torch 2.13.0's own wheels bring CUDA 13.0, so no CUDA base is needed "
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


@dataclass(frozen=True, kw_only=True)
class SecretSettings:
    """Settings read only as secret Outputs (``secret_setting``), never into StackSettings as
    plain text; ``from_mapping`` checks they are stored encrypted."""

    image_source_token: str = setting(
        "imageSourceToken",
        "",
        "Token that can read a private imageSourceRepo (e.g. a fine-grained read-only PAT), "
        "given to the ACR build task; set it with `pulumi config set --secret imageSourceToken "
        "...` (a plain-text value is refused). Empty for a public repository.",
        note='Not `secret: true`: the CLI then rejects the plain "" default on every stack that '
        "does not\nset a token (pulumi/pulumi#21865); infra/config.py refuses a token stored "
        "unencrypted.",
    )


@dataclass(frozen=True, kw_only=True)
class BudgetSettings:
    """The monthly budget on the resource group; ``amount`` 0 declares none."""

    amount: int = setting(
        "budget",
        0,
        "Monthly budget in USD for the stack's resource group (0 = none; the policy pack "
        "requires one).",
    )
    start_month: str = setting(
        "budgetStartMonth",
        "",
        "First month (YYYY-MM) of a new budget, from the current month to twelve months ahead, "
        "checked when the budget is created (a preview stops); empty starts it in the month it "
        "is created. Later changes are ignored, so a month that has since passed keeps the "
        "stack deployable.",
    )
    emails: tuple[str, ...] = setting(
        "budgetEmails", (), "Addresses alerted at 80% of the budget spent and 100% forecast."
    )


@dataclass(frozen=True, kw_only=True)
class JobInputs:
    """The settings the stack's jobs are read from (``job_settings``): the ``jobs`` map, or the
    one job of submitJob/trainerConfig/datasetPrefix."""

    submit_job: bool = setting(
        "submitJob",
        True,
        "Submit the training job (false stands up the environment and image only).",
    )
    trainer_config: str = setting(
        "trainerConfig",
        "trainer/presets/resnet50-cluster.yaml",
        "Trainer settings (YAML, path relative to the repository) for the job; validated before "
        "anything is created.",
    )
    dataset_prefix: str = setting(
        "datasetPrefix",
        "",
        "Folder in the datasets container with prepared shards (dt-data upload); each node "
        "stages it before training. Empty trains on what trainerConfig says.",
    )
    jobs: Mapping[str, Any] = setting(
        "jobs",
        {},
        "Named training jobs, each a Batch job on the pool - a map of name to {trainerConfig, "
        "or command (your own script: a list of words, or one string split as a POSIX shell "
        "would, never run by a shell) with engine (torch, the default: torchrun's variables; "
        "or horovod), code (a folder of the repository whose tracked files, with an optional "
        "requirements.txt, each node gets as its working directory without an image rebuild), "
        "nodes (default the pool size), datasetPrefix, priority (-1000..1000), "
        "maxWallClockHours (Batch stops the job this long after its creation; default 168, "
        "0 for none; the submitJob shorthand's job gets the default)}; "
        "set one with pulumi config set --path jobs.<name>.trainerConfig <file>. Adding or "
        "removing a job touches no other. Empty means the one job of submitJob/trainerConfig/"
        "datasetPrefix; giving both forms is an error.",
    )


@dataclass(frozen=True, kw_only=True)
class StackSettings:
    """The stack's settings, one section per component (each component takes its own)."""

    stack: str
    team: str = setting(
        "team",
        description="Team that owns the stack; in every name and tag (lowercase letters and "
        "digits).",
    )
    cost_center: str = setting(
        "costCenter",
        "unassigned",
        "Cost center tag for billing (1-256 characters, Azure's limit for a tag value).",
    )
    location: str = setting(
        "location", "eastus", "Azure region; must offer the GPU size (see infra/sizes.py)."
    )
    log_retention_days: int = setting("logRetentionDays", 30, "Days Log Analytics keeps logs.")
    blob_version_days: int = setting(
        "blobVersionDays",
        7,
        "Days the data account keeps a blob's previous versions (what an overwrite or a delete "
        "leaves, versioning being on) before its lifecycle policy deletes them; 0 to 3650.",
    )
    checkpoint_version_days: int = setting(
        "checkpointVersionDays",
        1,
        "Days previous versions in the checkpoints container are kept (each checkpoint the "
        "mirror prunes becomes one, as large as the model and its optimizer); 0 to 3650.",
    )
    protect_data: bool = setting(
        "protectData",
        True,
        "Protect storage accounts, the NFS share and NFS data disks so `pulumi destroy` removes "
        "compute only; false lets destroy delete data too.",
    )
    network: NetworkSettings
    cluster: ClusterSettings
    nfs: NfsSettings
    image: ImageSettings
    budget: BudgetSettings
    # The stack's training jobs: the `jobs` map, or the one job of submitJob/trainerConfig/
    # datasetPrefix (``JobInputs``).
    jobs: tuple[JobSettings, ...]
    protect_running_jobs: bool = setting(
        "protectRunningJobs",
        True,
        "Refuse (pulumi preview and up stop with one line naming the job) a change that would "
        "replace a job that is still running, unless the job is listed in replaceJobs.",
    )
    replace_jobs: tuple[str, ...] = setting(
        "replaceJobs",
        (),
        "Names of running jobs that this deployment may replace (the new job resumes from their "
        "newest checkpoint when its training settings are the same).",
    )
    acceptance_profile: str = setting(
        "acceptanceProfile",
        "",
        "Empty for every team stack. cpu or gpu marks a throwaway acceptance stack made by "
        "python -m dt_commands.acceptance (make azure-check) - cpu admits the CPU size "
        "Standard_D2ds_v5 (the start task then skips the GPU and InfiniBand checks and says so; "
        "the pool carries metadata acceptance=cpu for the policy pack); both require "
        "protectData false and grant the deployer read access to the logs.",
    )

    @classmethod
    def from_mapping(
        cls, stack: str, values: Mapping[str, Any], schema: Mapping[str, Mapping[str, Any]]
    ) -> StackSettings:
        """Merge ``values`` (camelCase keys, short or ``gpu-cluster:``-prefixed) over the schema
        defaults, check types against the schema, then the cross-field rules."""
        given = _known_values(values, schema)
        typed = _typed_values(given, schema)
        inputs = _section(JobInputs, typed)
        plain = {f.name: getattr(inputs, f.name) for f, _ in declared(JobInputs)}
        jobs = job_settings({**plain, "node_count": typed["nodeCount"]}, set(given))
        return cls(
            stack=stack,
            **_fields(cls, typed),
            network=_section(NetworkSettings, typed),
            cluster=_section(ClusterSettings, typed),
            nfs=_section(NfsSettings, typed),
            # Unset: the checkout's origin, which the acr builder clones anyway.
            image=_section(
                ImageSettings,
                typed,
                source_repo=typed["imageSourceRepo"] or origin_clone_url() or "",
            ),
            budget=_section(BudgetSettings, typed),
            jobs=jobs,
        )

    def __post_init__(self) -> None:
        cluster, nfs = self.cluster, self.nfs
        if not _TEAM.match(self.team):
            raise ConfigError(
                f"team={self.team!r}: use 2-12 lowercase letters and digits, starting with a "
                "letter (it becomes part of storage account names)"
            )
        if cluster.vm_size in RETIRED or cluster.vm_size in NOT_YET:
            why = RETIRED.get(cluster.vm_size) or NOT_YET[cluster.vm_size]
            raise ConfigError(f"vmSize={cluster.vm_size}: {why}; use one of {', '.join(SUPPORTED)}")
        self._check_acceptance()
        if cluster.vm_size not in SUPPORTED and not self._cpu_acceptance:
            raise ConfigError(
                f"vmSize={cluster.vm_size}: not an InfiniBand GPU size we support; "
                f"use one of {', '.join(SUPPORTED)}"
            )
        if self.location not in cluster.gpu.regions:
            raise ConfigError(
                f"location={self.location}: {cluster.vm_size} is not offered there "
                f"in our table; use one of {', '.join(sorted(cluster.gpu.regions))}"
            )
        self._check_spot()
        _range("nodeCount", cluster.node_count, 1, MAX_NODES)
        if cluster.scale_mode not in SCALE_MODES:
            raise ConfigError(f"scaleMode={cluster.scale_mode!r}: use {' or '.join(SCALE_MODES)}")
        _range("idleMinutes", cluster.idle_minutes, 5, 1440)
        # Azure grows an image's OS disk but never shrinks it; 4095 GB is a managed OS disk's
        # largest size (articles/virtual-machines/managed-disks-overview.md).
        _range("osDiskSizeGb", cluster.os_disk_size_gb, cluster.gpu.image.os_disk_gb, 4095)
        if nfs.mode not in NFS_MODES:
            raise ConfigError(f"nfsMode={nfs.mode!r}: use {' or '.join(NFS_MODES)}")
        _range("nfsDiskCount", nfs.disk_count, 1, 16)
        _range("nfsDiskSizeGb", nfs.disk_size_gb, 32, 32767)
        _range("nfsShareQuotaGb", nfs.share_quota_gb, 100, 102400)
        _range("logRetentionDays", self.log_retention_days, 30, 730)
        # Our bound, not Azure's: a longer history belongs in a copy, not in previous versions.
        _range("blobVersionDays", self.blob_version_days, 0, 3650)
        _range("checkpointVersionDays", self.checkpoint_version_days, 0, 3650)
        if nfs.mode == "vm" and not _SSH_KEY.match(nfs.ssh_public_key):
            raise ConfigError(
                f"sshPublicKey={nfs.ssh_public_key[:20]!r}: nfsMode vm needs an OpenSSH public "
                'key; run pulumi config set sshPublicKey "$(cat ~/.ssh/id_ed25519.pub)"'
            )
        if cluster.job_submitter_type not in PRINCIPAL_TYPES:
            raise ConfigError(
                f"jobSubmitterType={cluster.job_submitter_type!r}: use {', '.join(PRINCIPAL_TYPES)}"
            )
        if cluster.job_submitter_object_id and not _GUID.match(cluster.job_submitter_object_id):
            raise ConfigError(
                f"jobSubmitterObjectId={cluster.job_submitter_object_id!r}: an Entra "
                "object id is a GUID (az ad group show -g <name> --query id)"
            )
        self._check_budget()
        self._check_network()
        self._check_tags()
        self._check_image()
        self._check_jobs()

    def _check_spot(self) -> None:
        """Spot is the whole pool or nothing: whether one InfiniBand (multi-instance) task may
        span Spot and dedicated nodes is not documented, and batch-spot-vms.md warns that
        multi-VM MPI jobs suit Spot poorly, as one eviction reruns the whole job (read
        2026-11-28). An evicted run resumes only from a checkpoint."""
        if self.cluster.spot and not self.cluster.checkpointing:
            raise ConfigError(
                "spot=true with checkpointing=false: Azure evicts Spot nodes at any time and the "
                "job then starts again from step 0; set checkpointing true, or spot false"
            )

    @property
    def _cpu_acceptance(self) -> bool:
        return self.acceptance_profile == "cpu" and self.cluster.vm_size in CPU_ACCEPTANCE

    def _check_acceptance(self) -> None:
        """The CPU size exists for acceptance stacks only: any other stack that names it gets
        the same error as any other non-InfiniBand size (checked by the caller)."""
        profile, vm_size = self.acceptance_profile, self.cluster.vm_size
        if profile not in ACCEPTANCE_PROFILES:
            raise ConfigError(
                f"acceptanceProfile={profile!r}: use cpu or gpu (python -m "
                "dt_commands.acceptance sets it), or leave it empty for a team stack"
            )
        if profile == "cpu" and vm_size not in CPU_ACCEPTANCE:
            raise ConfigError(
                f"vmSize={vm_size}: acceptanceProfile cpu runs on the CPU acceptance size; "
                f"use {', '.join(CPU_ACCEPTANCE)}"
            )
        if profile and self.protect_data:
            raise ConfigError(
                f"protectData=true with acceptanceProfile={profile}: an acceptance stack is "
                "destroyed whole, data included; set protectData false"
            )

    def _check_image(self) -> None:
        image = self.image
        if image.builder not in IMAGE_BUILDERS:
            raise ConfigError(f"imageBuilder={image.builder!r}: use {' or '.join(IMAGE_BUILDERS)}")
        if image.ref or image.registry_id:
            self._check_image_ref()
            return  # nothing is built: the build settings do not matter
        if image.builder == "docker" and not self.network.registry_allowed_ips:
            # The push and its token exchange come from this machine, which the registry's
            # network rules admit only through registryAllowedIps (infra/registry.py).
            raise ConfigError(
                "imageBuilder=docker: the image is pushed from the machine running pulumi up, "
                "and the registry's firewall admits no such address (registryAllowedIps is "
                "empty); add its public address to registryAllowedIps, or use imageBuilder acr"
            )
        if image.builder == "acr" and not _GIT_URL.match(image.source_repo):
            raise ConfigError(
                f"imageSourceRepo={image.source_repo!r}: the acr builder clones this "
                "repository and no https or ssh origin remote says where it is; give its "
                "https://.../<name>.git URL (or use imageBuilder docker)"
            )
        if not _IMAGE_REF.match(image.base):
            raise ConfigError(
                f"imageBase={image.base!r}: give [<registry>/]<repository>:<tag>, "
                "for example ubuntu:22.04"
            )
        cuda = cuda_of_base(image.base)
        if cuda is not None and cuda != CUDA:
            raise ConfigError(
                f"imageBase={image.base}: CUDA {cuda}, but torch's wheel is built for CUDA "
                f"{CUDA}; use ubuntu:22.04 (torch's wheels bring CUDA) or a CUDA {CUDA}.x base"
            )
        base_os = os_of_base(image.base)
        if base_os is not None and base_os != BASE_OS:
            manager = "apt" if base_os.startswith(APT_FAMILIES) else "apt, which it does not have"
            raise ConfigError(
                f"imageBase={image.base}: a {base_os} image, but the trainer image installs "
                f"{BASE_OS}'s packages with {manager} (python3.11, the InfiniBand user space: "
                f"docker/Dockerfile); use an {BASE_OS} base such as ubuntu:22.04"
            )
        if image.base_digest and not _DIGEST.match(image.base_digest):
            raise ConfigError(
                f"imageBaseDigest={image.base_digest!r}: give sha256:<64 hex digits> "
                "(docker buildx imagetools inspect <imageBase>) or leave it empty"
            )

    def _check_image_ref(self) -> None:
        """An image the nodes can pull with their managed identity: only an Azure container
        registry accepts it (Batch ContainerRegistry.identityReference, "to access an Azure
        Container Registry instead of username and password"), and only a registry whose id
        is given can get the AcrPull grant, at its own scope."""
        image, parts = self.image, self.image.ref_parts
        if not image.ref:
            raise ConfigError(
                f"imageRegistryId={image.registry_id}: set without imageRef; set imageRef to "
                "an image in that registry, or leave both empty to build the image"
            )
        if parts is None:
            raise ConfigError(
                f"imageRef={image.ref}: give <name>.azurecr.io/<repository>@sha256:<digest>; the "
                "nodes pull with their managed identity, which only an Azure container registry "
                "accepts"
            )
        if not parts["tag"] and not parts["digest"]:
            raise ConfigError(
                f"imageRef={image.ref}: neither a digest nor a tag names the image; append "
                "@sha256:<digest> (az acr repository show -n <registry> --image <repo>:<tag>)"
            )
        registry = _REGISTRY_ID.match(image.registry_id)
        if registry is None or registry["name"].lower() != parts["registry"]:
            raise ConfigError(
                f"imageRegistryId={image.registry_id or '(empty)'}: imageRef's registry "
                f"{parts['registry']} needs its ARM id, where the nodes get AcrPull; set it to "
                f"`az acr show -n {parts['registry']} --query id -o tsv`"
            )

    def _check_jobs(self) -> None:
        names = [job.name for job in self.jobs]
        pool_nodes = self.cluster.node_count
        for job in self.jobs:
            if job.nodes > pool_nodes:
                raise ConfigError(
                    f"jobs.{job.name}.nodes={job.nodes}: the pool has {pool_nodes} nodes "
                    "(nodeCount); use at most that many"
                )
            # `pulumi up` uploads the code into the data account, whose firewall admits only
            # these addresses and the VNet (infra/code_upload.py).
            if job.code is not None and not self.network.storage_allowed_ips:
                raise ConfigError(
                    f"jobs.{job.name}.code={job.code.folder!r}: `pulumi up` uploads it to the "
                    "data storage account, whose firewall admits no deployer's address "
                    "(storageAllowedIps is empty); add the public address of the machine "
                    "that runs `pulumi up` to storageAllowedIps"
                )
        unknown = sorted(set(self.replace_jobs) - set(names))
        if unknown:
            raise ConfigError(
                f"replaceJobs={list(self.replace_jobs)}: no job named {unknown[0]!r}; the "
                f"stack's jobs are {', '.join(names) or 'none'}"
            )

    def _check_budget(self) -> None:
        budget = self.budget
        _range("budget", budget.amount, 0, 10_000_000)
        if not budget.amount:
            return
        if budget.start_month and not _MONTH.match(budget.start_month):
            raise ConfigError(
                f"budgetStartMonth={budget.start_month!r}: give the first "
                "month as YYYY-MM, or leave it empty to start in the month it is created"
            )
        # Whether the month is one Azure takes depends on the month the budget is created in,
        # which only the engine knows: checked then (infra/budget.py), never on later updates.
        if not budget.emails or not all(_EMAIL.match(e) for e in budget.emails):
            raise ConfigError(
                f"budgetEmails={list(budget.emails)}: a budget needs at least "
                "one valid e-mail address to alert"
            )

    def _check_network(self) -> None:
        net, max_nodes = self.network, self.cluster.node_count
        vnet = _network("vnetCidr", net.vnet_cidr)
        if not vnet.is_private:
            raise ConfigError(f"vnetCidr={net.vnet_cidr}: must be private (RFC 1918)")
        compute = _network("computeSubnetCidr", net.compute_subnet_cidr)
        storage = _network("storageSubnetCidr", net.storage_subnet_cidr)
        for key, subnet in (("computeSubnetCidr", compute), ("storageSubnetCidr", storage)):
            if not subnet.subnet_of(vnet):  # type: ignore[arg-type]
                raise ConfigError(f"{key}={subnet}: must lie inside vnetCidr={vnet}")
        if compute.overlaps(storage):
            raise ConfigError(
                f"computeSubnetCidr={compute} overlaps storageSubnetCidr="
                f"{storage}: give them separate ranges"
            )
        # Azure keeps 5 addresses per subnet; Batch needs one per node plus headroom for
        # replacing nodes.
        if compute.num_addresses - 5 < 2 * max_nodes:
            raise ConfigError(
                f"computeSubnetCidr={compute}: too small for {max_nodes} nodes; use a larger range"
            )
        if storage.prefixlen > 28:
            raise ConfigError(f"storageSubnetCidr={storage}: use /28 or larger")
        for key, allowed, storage_rule in (
            ("registryAllowedIps", net.registry_allowed_ips, False),
            ("storageAllowedIps", net.storage_allowed_ips, True),
        ):
            for text in allowed:
                _network(key, text)
                problem = ip_rule_problem(text, storage=storage_rule)
                if problem is not None:
                    raise ConfigError(f"{key}={text!r}: {problem}")

    def _check_tags(self) -> None:
        """The tags every resource carries (``naming.default_tags``) within Azure's limits."""
        if not self.cost_center.strip():
            raise ConfigError(
                f"costCenter={self.cost_center!r}: every resource carries a cost-center tag "
                "(the policy pack requires it); set one: pulumi config set costCenter cc-4711"
            )
        problem = tag_problem(
            default_tags(team=self.team, stack=self.stack, cost_center=self.cost_center)
        )
        if problem is not None:
            tag, reason = problem
            setting = {"cost-center": "costCenter", "stack": "stack", "team": "team"}.get(tag)
            raise ConfigError(f"{setting or 'tag ' + tag}{reason}")

    def cost_inputs(self) -> CostInputs:
        """What the offline cost estimate (``infra.cost``) prices of these settings."""
        cluster, nfs = self.cluster, self.nfs
        vm_mode = nfs.mode == "vm"
        return CostInputs(
            gpu_size=cluster.vm_size,
            nodes=cluster.node_count,
            spot=cluster.spot,
            always_on=cluster.scale_mode == "fixed",
            nfs_vm_size=nfs.vm_size if vm_mode else None,
            nfs_disk_gb=nfs.disk_count * nfs.disk_size_gb if vm_mode else 0,
            files_share_gb=0 if vm_mode else nfs.share_quota_gb,
            own_registry=not self.image.ref,
        )


# Every class that declares stack settings, in Pulumi.yaml's order.
DECLARING: tuple[type, ...] = (
    StackSettings,
    NetworkSettings,
    ClusterSettings,
    NfsSettings,
    ImageSettings,
    SecretSettings,
    BudgetSettings,
    JobInputs,
)


def declared_schema() -> dict[str, dict[str, Any]]:
    """Pulumi.yaml's ``config:`` schema as the declarations give it (``load_schema`` reads the
    file; a test keeps the two equal)."""
    return schema_of(*DECLARING)


# Settings an earlier release read, and what a stack file that still sets one should do.
REPLACED_SETTINGS = {
    "spotNodes": "replaced by spot (the pool is all Spot or all dedicated, nodeCount nodes "
    "either way): remove spotNodes; to run on Spot, set spot: true",
}


def _known_values(values: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` by short key; an unknown key is an error."""
    known: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = str(raw_key).removeprefix(f"{PROJECT}:")
        if key in REPLACED_SETTINGS:
            raise ConfigError(f"{key}: {REPLACED_SETTINGS[key]}")
        if key not in schema:
            raise ConfigError(
                f"unknown setting {key!r}; valid settings are {', '.join(sorted(schema))}"
            )
        known[key] = value
    return known


def _typed_values(given: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting of ``schema`` but the secrets, typed: the given value or the default."""
    homeless = sorted(set(schema) - {d.key for cls in DECLARING for _, d in declared(cls)})
    if homeless:
        raise TypeError(f"settings with no home in StackSettings: {', '.join(homeless)}")
    typed: dict[str, Any] = {}
    for key, spec in schema.items():
        if key in SECRET_SETTINGS:
            _check_encrypted(key, given.get(key))
            continue
        if key not in given and "default" not in spec and "value" not in spec:
            raise ConfigError(f"{key}: required; set it with `pulumi config set {key} ...`")
        typed[key] = _typed(key, given.get(key, schema_default(spec)), spec)
    return typed


def _fields(cls: type, typed: Mapping[str, Any]) -> dict[str, Any]:
    """The declared fields of ``cls`` from the typed values (lists become tuples)."""
    return {
        f.name: tuple(typed[d.key]) if isinstance(typed[d.key], list) else typed[d.key]
        for f, d in declared(cls)
    }


def _section(cls: type[_S], typed: Mapping[str, Any], **overrides: Any) -> _S:
    return cls(**{**_fields(cls, typed), **overrides})


@dataclass(frozen=True)
class JobSettings:
    """One training job of the stack: its trainer settings (read and validated when the stack's
    settings load) or its own command and engine, its node count, the dataset it stages and its
    Batch priority."""

    name: str
    trainer: TrainerSettings | None  # None for a job that runs its own command
    nodes: int
    dataset_prefix: str = ""
    priority: int = 0
    command: tuple[str, ...] = ()  # the job's own worker command (docs/jobs.md, Your own script)
    engine: str = ""  # how its workers meet (SCRIPT_ENGINES); "" for the trainer
    # The job's code folder as one snapshot (docs/jobs.md, Your code without an image rebuild)
    code: CodeSnapshot | None = None
    # Hours from the job's creation until Batch stops it (0: none): docs/jobs.md, Limits.
    max_wall_clock_hours: int = DEFAULT_WALL_CLOCK_HOURS


def _read_trainer_settings(key: str, path: str) -> TrainerSettings:
    try:
        return TrainerSettings.read(path, REPO)
    except TrainerSettingsError as err:
        raise ConfigError(f"{key}={path}: {err}") from None


def job_settings(values: Mapping[str, Any], given: set[str]) -> tuple[JobSettings, ...]:
    """The stack's jobs: each entry of the ``jobs`` map, or (when the map is empty) the one job
    of ``submitJob``/``trainerConfig``/``datasetPrefix``. Giving both forms is an error."""
    jobs = values["jobs"]
    node_count = values["node_count"]
    if not jobs:
        prefix = values["dataset_prefix"]
        _check_prefix("datasetPrefix", prefix)
        if not values["submit_job"]:
            return ()
        trainer = _read_trainer_settings("trainerConfig", values["trainer_config"])
        shorthand = JobSettings(SHORTHAND_JOB, trainer, node_count, prefix)
        _check_runnable(shorthand)
        return (shorthand,)
    both = sorted(given & {"submitJob", "trainerConfig", "datasetPrefix"})
    if both:
        raise ConfigError(
            f"jobs and {both[0]} are both set: give each job's settings in the jobs map "
            f"(jobs.<name>.trainerConfig, nodes, datasetPrefix, priority) and remove {both[0]}"
        )
    parsed = []
    for name, entry in sorted(jobs.items()):
        if not isinstance(name, str) or not _JOB_NAME.match(name):
            raise ConfigError(
                f"jobs.{name}: a job name is 1-20 lowercase letters, digits and '-', starting "
                "with a letter (it becomes part of the Batch job id)"
            )
        if not isinstance(entry, dict):
            raise ConfigError(
                f"jobs.{name}={entry!r}: give a mapping with trainerConfig or command"
            )
        unknown = sorted(set(entry) - set(JOB_KEYS))
        if unknown:
            raise ConfigError(
                f"jobs.{name}.{unknown[0]}: unknown; a job takes {', '.join(JOB_KEYS)}"
            )
        nodes = _typed(f"jobs.{name}.nodes", entry.get("nodes", node_count), {"type": "integer"})
        priority = _typed(f"jobs.{name}.priority", entry.get("priority", 0), {"type": "integer"})
        prefix = _typed(
            f"jobs.{name}.datasetPrefix", entry.get("datasetPrefix", ""), {"type": "string"}
        )
        _range(f"jobs.{name}.nodes", nodes, 1, MAX_NODES)
        # Batch job priorities run from -1000 (lowest) to 1000 (highest).
        _range(f"jobs.{name}.priority", priority, -1000, 1000)
        _check_prefix(f"jobs.{name}.datasetPrefix", prefix)
        hours = _typed(
            f"jobs.{name}.maxWallClockHours",
            entry.get("maxWallClockHours", DEFAULT_WALL_CLOCK_HOURS),
            {"type": "integer"},
        )
        _range(f"jobs.{name}.maxWallClockHours", hours, 0, MAX_WALL_CLOCK_HOURS)
        trainer, command, engine = _what_runs(name, entry)
        code = _code(name, entry)
        job = JobSettings(name, trainer, nodes, prefix, priority, command, engine, code, hours)
        _check_runnable(job)
        parsed.append(job)
    return tuple(parsed)


def _what_runs(
    name: str, entry: Mapping[str, Any]
) -> tuple[TrainerSettings | None, tuple[str, ...], str]:
    """(trainer settings, command, engine) of the job ``name``: its trainerConfig, or its own
    command and engine; never both."""
    if "command" in entry:
        if "trainerConfig" in entry:
            raise ConfigError(
                f"jobs.{name}: command and trainerConfig are both set: a job runs either the "
                f"trainer or your command; remove jobs.{name}.trainerConfig or "
                f"jobs.{name}.command"
            )
        return _script(name, entry)
    if "engine" in entry:
        raise ConfigError(
            f"jobs.{name}.engine={entry['engine']!r}: only a job with a command chooses its "
            f"engine (the trainer's comes from its trainerConfig's backend); remove it"
        )
    trainer_config = entry.get("trainerConfig")
    if not isinstance(trainer_config, str) or not trainer_config:
        raise ConfigError(
            f"jobs.{name}.trainerConfig: required (a trainer YAML path), or give "
            f"jobs.{name}.command"
        )
    return _read_trainer_settings(f"jobs.{name}.trainerConfig", trainer_config), (), ""


def _code(name: str, entry: Mapping[str, Any]) -> CodeSnapshot | None:
    """The snapshot of the job's code folder, built (and refused) before anything is created."""
    if "code" not in entry:
        return None
    folder = _typed(f"jobs.{name}.code", entry["code"], {"type": "string"})
    try:
        return snapshot(folder, REPO)
    except SnapshotError as err:
        raise ConfigError(f"jobs.{name}.code={folder!r}: {err}") from None


def _script(name: str, entry: Mapping[str, Any]) -> tuple[None, tuple[str, ...], str]:
    """(no trainer settings, the job's command as argv, its engine)."""
    try:
        command = script_argv(entry["command"])
    except ValueError as err:
        raise ConfigError(f"jobs.{name}.command={entry['command']!r}: {err}") from None
    engine = entry.get("engine", DEFAULT_SCRIPT_ENGINE)
    if engine not in SCRIPT_ENGINES:
        raise ConfigError(
            f"jobs.{name}.engine={engine!r}: choose {' or '.join(SCRIPT_ENGINES)} (torch: "
            "torchrun's variables, for torch.distributed, Accelerate or Lightning scripts; "
            "horovod: horovodrun's, for a Horovod script)"
        )
    return None, command, engine


SECRET_SETTINGS = tuple(d.key for _, d in declared(SecretSettings))


def _check_runnable(job: JobSettings) -> None:
    """What the job runs (its command's script or module, its trainer's plug-ins) is in the
    image or in its code folder (infra.runnable)."""
    code_files = job.code.file_names if job.code is not None else None
    where = (
        f"its code folder {job.code.folder}"
        if job.code is not None
        else "a code folder (the job has none)"
    )
    if job.command and (started := what_runs(job.command)) is not None:
        kind, name = started
        if missing(kind, name, code_files, _repo_packages()):
            raise ConfigError(
                f"jobs.{job.name}.command={shlex.join(job.command)!r}: its {kind} {name} is "
                f"neither in the image (which holds trainer/ alone) nor in {where}; set "
                f"jobs.{job.name}.code to the folder holding it and name the {kind} relative "
                "to that folder (code: examples/torchrun_ddp, command: python train.py)"
            )
    config = job.trainer.config if job.trainer is not None else None
    for plugin in ("model", "data", "loss", "metric") if config is not None else ():
        ref = getattr(config, plugin)
        module = ref.partition(":")[0] if is_plugin_ref(ref) else ""
        if module and missing("module", module, code_files, _repo_packages()):
            raise ConfigError(
                f"jobs.{job.name}: trainerConfig's {plugin}={ref}: the module is neither in "
                f"the image (which holds trainer/ alone) nor in {where}; set "
                f"jobs.{job.name}.code to the folder that holds its package"
            )


def _repo_packages() -> frozenset[str]:
    """The repository's top-level Python packages (infra.runnable)."""
    return frozenset(p.name for p in REPO.iterdir() if (p / "__init__.py").is_file())


def _check_prefix(key: str, prefix: str) -> None:
    if prefix and not _PREFIX.match(prefix):
        raise ConfigError(
            f"{key}={prefix!r}: use letters, digits, '.', '_', '-' "
            "and '/' (the folder you uploaded with dt-data upload)"
        )


def schema_type(spec: Mapping[str, Any]) -> str:
    return str(spec.get("type", "object"))


def schema_default(spec: Mapping[str, Any]) -> Any:
    return spec["default"] if "default" in spec else spec.get("value")


def _typed(key: str, value: Any, spec: Mapping[str, Any]) -> Any:
    expected = _SCHEMA_TYPES[schema_type(spec)]
    # `pulumi config set` stores scalars as strings; structured values arrive as JSON text.
    if isinstance(value, str) and expected is int and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    if isinstance(value, str) and expected is bool and value in ("true", "false"):
        return value == "true"
    if isinstance(value, str) and expected in (list, dict) and value.strip()[:1] in ("[", "{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{key}={value!r}: not valid {schema_type(spec)} JSON") from None
    if (isinstance(value, bool) and expected is int) or not isinstance(value, expected):
        raise ConfigError(f"{key}={value!r}: expected {schema_type(spec)}")
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}={value!r}: expected a list of strings")
    return value


def _check_encrypted(key: str, value: Any) -> None:
    """A secret setting is empty or encrypted: ``{secure: ...}`` in a stack file (as the offline
    plan reads it, or its JSON text as mocks pass it); never plain text in a tracked file."""
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = {}  # not JSON: plain text
    if value in (None, "") or (isinstance(value, dict) and set(value) == {"secure"}):
        return
    raise ConfigError(
        f"{key}: stored in plain text in the stack file; remove it and run "
        f"`pulumi config set --secret {key} <value>` so it is encrypted"
    )


def _range(key: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{key}={value}: must be in {low}..{high}")


def current_month() -> str:
    """This month (UTC) as YYYY-MM: a new budget's first period."""
    return datetime.now(UTC).strftime("%Y-%m")


def _network(key: str, text: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(text, strict=True)
    except ValueError as err:
        raise ConfigError(f"{key}={text!r}: not an IPv4 CIDR ({err})") from None


def load() -> StackSettings:
    """Read the running stack's config (Pulumi merges Pulumi.yaml defaults; we merge too)."""
    import pulumi

    schema = load_schema()
    config = pulumi.Config(PROJECT)
    values = {}
    for key, spec in schema.items():
        if key in SECRET_SETTINGS and pulumi.runtime.is_config_secret(f"{PROJECT}:{key}"):
            values[key] = {"secure": "(encrypted)"}  # checked as stored, read by secret_setting
            continue
        structured = schema_type(spec) in ("array", "object")
        raw = config.get_object(key) if structured else config.get(key)
        if raw is not None:
            values[key] = raw
    return StackSettings.from_mapping(pulumi.get_stack(), values, schema)


def secret_setting(key: str):
    """A ``SECRET_SETTINGS`` value as a secret ``Output[str]`` (``Config.get_secret``), or None
    when unset: it never exists as plain text in the program, the state or the plan."""
    import pulumi

    if key not in SECRET_SETTINGS:
        raise ValueError(f"{key} is not a secret setting")
    return pulumi.Config(PROJECT).get_secret(key)


def main(argv: list[str] | None = None) -> int:
    """python -m infra.config [--write]: print Pulumi.yaml's ``config:`` block as the
    declarations give it, or rewrite the block in Pulumi.yaml."""
    from trainer.common.cli import OneLineParser

    parser = OneLineParser(prog="python -m infra.config", description=main.__doc__)
    parser.add_argument("--write", action="store_true", help=f"rewrite {PROJECT_FILE.name}")
    args = parser.parse_args(argv)
    block = render_block(PROJECT, declared_schema(), notes_of(*DECLARING))
    if args.write:
        text = PROJECT_FILE.read_text(encoding="utf-8")
        PROJECT_FILE.write_text(with_block(text, block), encoding="utf-8")
    else:
        print(block, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
