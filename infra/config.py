"""The stack's settings: frozen dataclasses built and validated by a pure ``from_mapping``.

Defaults are read from the ``config:`` schema in Pulumi.yaml (their one home): the Pulumi CLI
applies them itself, but mocks and the offline plan do not, so ``load_schema()`` merges them
here too. Every bad value raises ``ConfigError`` naming the key, the value and the fix, before
any resource is declared.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from infra.sizes import CPU_ACCEPTANCE, RETIRED, SUPPORTED, GpuSize, size_of
from infra.toolchain import CUDA, cuda_of_base
from trainer.config import one_line

PROJECT = "gpu-cluster"
PROJECT_FILE = Path(__file__).resolve().parent.parent / "Pulumi.yaml"
SCALE_MODES = ("fixed", "autoscale")
NFS_MODES = ("vm", "azurefiles")
IMAGE_BUILDERS = ("acr", "docker")
# "" for team stacks; the throwaway stacks of python -m infra.acceptance say which profile.
ACCEPTANCE_PROFILES = ("", "cpu", "gpu")
# Read only as secret Outputs (``secret_setting``), never into StackSettings as plain text.
SECRET_SETTINGS = ("imageSourceToken",)
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
_IMAGE_REF = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+:[A-Za-z0-9._-]+$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,200}$")
_GUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
# Pulumi.yaml has no object type: a map setting is declared with a plain `value:` default.
_SCHEMA_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}
_JOB_NAME = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
JOB_KEYS = ("trainerConfig", "nodes", "datasetPrefix", "priority")
SHORTHAND_JOB = "default"  # the one job of submitJob/trainerConfig/datasetPrefix


class ConfigError(ValueError):
    """A stack setting is invalid; the message is one line for the user."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def load_schema(path: Path = PROJECT_FILE) -> dict[str, dict[str, Any]]:
    """The ``config:`` schema of Pulumi.yaml keyed by short name (``vmSize``)."""
    project = yaml.safe_load(path.read_text(encoding="utf-8"))
    prefix = f"{project['name']}:"
    return {key.removeprefix(prefix): spec for key, spec in project["config"].items()}


@dataclass(frozen=True)
class StackSettings:
    stack: str
    team: str
    cost_center: str
    location: str
    vnet_cidr: str
    compute_subnet_cidr: str
    storage_subnet_cidr: str
    vm_size: str
    node_count: int
    spot_nodes: int
    scale_mode: str
    idle_minutes: int
    nfs_mode: str
    nfs_vm_size: str
    nfs_disk_count: int
    nfs_disk_size_gb: int
    nfs_share_quota_gb: int
    ssh_public_key: str
    storage_allowed_ips: tuple[str, ...]
    registry_allowed_ips: tuple[str, ...]
    log_retention_days: int
    protect_data: bool
    checkpointing: bool
    budget: int
    budget_start_month: str
    budget_emails: tuple[str, ...]
    job_submitter_object_id: str
    job_submitter_type: str
    image_builder: str
    image_source_repo: str
    image_base: str
    image_base_digest: str
    submit_job: bool
    trainer_config: str
    dataset_prefix: str
    # The stack's training jobs: the `jobs` map, or the one job of the three settings above.
    jobs: tuple[JobSettings, ...]
    protect_running_jobs: bool
    replace_jobs: tuple[str, ...]
    acceptance_profile: str = ""

    @property
    def gpu(self) -> GpuSize:
        """The pool's size: an InfiniBand GPU size, or (acceptance profile cpu only) the CPU
        acceptance size, whose ``gpus`` and ``ib_ports`` are 0."""
        return size_of(self.vm_size)

    @property
    def max_nodes(self) -> int:
        return self.node_count + self.spot_nodes

    @classmethod
    def from_mapping(
        cls, stack: str, values: Mapping[str, Any], schema: Mapping[str, Mapping[str, Any]]
    ) -> StackSettings:
        """Merge ``values`` (camelCase keys, short or ``gpu-cluster:``-prefixed) over the schema
        defaults, check types against the schema, then the cross-field rules."""
        merged: dict[str, Any] = {}
        for raw_key, value in values.items():
            key = str(raw_key).removeprefix(f"{PROJECT}:")
            if key not in schema:
                raise ConfigError(
                    f"unknown setting {key!r}; valid settings are {', '.join(sorted(schema))}"
                )
            merged[key] = value
        kwargs: dict[str, Any] = {}
        for key, spec in schema.items():
            if key in SECRET_SETTINGS:
                _check_encrypted(key, merged.get(key))
                continue
            if key not in merged and "default" not in spec and "value" not in spec:
                raise ConfigError(f"{key}: required; set it with `pulumi config set {key} ...`")
            value = merged.get(key, schema_default(spec))
            kwargs[_snake(key)] = _typed(key, value, spec)
        kwargs["jobs"] = job_settings(kwargs, set(merged))
        kwargs["replace_jobs"] = tuple(kwargs["replace_jobs"])
        kwargs["registry_allowed_ips"] = tuple(kwargs["registry_allowed_ips"])
        kwargs["storage_allowed_ips"] = tuple(kwargs["storage_allowed_ips"])
        kwargs["budget_emails"] = tuple(kwargs["budget_emails"])
        return cls(stack=stack, **kwargs)

    def __post_init__(self) -> None:
        if not _TEAM.match(self.team):
            raise ConfigError(
                f"team={self.team!r}: use 2-12 lowercase letters and digits, starting with a "
                "letter (it becomes part of storage account names)"
            )
        if self.vm_size in RETIRED:
            raise ConfigError(
                f"vmSize={self.vm_size}: {RETIRED[self.vm_size]}; use one of {', '.join(SUPPORTED)}"
            )
        self._check_acceptance()
        if self.vm_size not in SUPPORTED and not self._cpu_acceptance:
            raise ConfigError(
                f"vmSize={self.vm_size}: not an InfiniBand GPU size we support; "
                f"use one of {', '.join(SUPPORTED)}"
            )
        if self.location not in self.gpu.regions:
            raise ConfigError(
                f"location={self.location}: {self.vm_size} is not offered there "
                f"in our table; use one of {', '.join(sorted(self.gpu.regions))}"
            )
        _range("nodeCount", self.node_count, 0, 100)
        _range("spotNodes", self.spot_nodes, 0, 100)
        if self.max_nodes < 1:
            raise ConfigError("nodeCount=0 with spotNodes=0: the pool needs at least one node")
        if self.scale_mode not in SCALE_MODES:
            raise ConfigError(f"scaleMode={self.scale_mode!r}: use {' or '.join(SCALE_MODES)}")
        _range("idleMinutes", self.idle_minutes, 5, 1440)
        if self.nfs_mode not in NFS_MODES:
            raise ConfigError(f"nfsMode={self.nfs_mode!r}: use {' or '.join(NFS_MODES)}")
        _range("nfsDiskCount", self.nfs_disk_count, 1, 16)
        _range("nfsDiskSizeGb", self.nfs_disk_size_gb, 32, 32767)
        _range("nfsShareQuotaGb", self.nfs_share_quota_gb, 100, 102400)
        _range("logRetentionDays", self.log_retention_days, 30, 730)
        if self.nfs_mode == "vm" and not _SSH_KEY.match(self.ssh_public_key):
            raise ConfigError(
                f"sshPublicKey={self.ssh_public_key[:20]!r}: nfsMode vm needs an OpenSSH public "
                'key; run pulumi config set sshPublicKey "$(cat ~/.ssh/id_ed25519.pub)"'
            )
        if self.spot_nodes and not self.checkpointing:
            raise ConfigError(
                f"spotNodes={self.spot_nodes} with checkpointing=false: Spot nodes "
                "are evicted at any time; turn checkpointing on or use 0 Spot nodes"
            )
        if self.job_submitter_type not in PRINCIPAL_TYPES:
            raise ConfigError(
                f"jobSubmitterType={self.job_submitter_type!r}: use {', '.join(PRINCIPAL_TYPES)}"
            )
        if self.job_submitter_object_id and not _GUID.match(self.job_submitter_object_id):
            raise ConfigError(
                f"jobSubmitterObjectId={self.job_submitter_object_id!r}: an Entra "
                "object id is a GUID (az ad group show -g <name> --query id)"
            )
        self._check_budget()
        self._check_network()
        self._check_image()
        self._check_jobs()

    @property
    def _cpu_acceptance(self) -> bool:
        return self.acceptance_profile == "cpu" and self.vm_size in CPU_ACCEPTANCE

    def _check_acceptance(self) -> None:
        """The CPU size exists for acceptance stacks only: any other stack that names it gets
        the same error as any other non-InfiniBand size (checked by the caller)."""
        profile = self.acceptance_profile
        if profile not in ACCEPTANCE_PROFILES:
            raise ConfigError(
                f"acceptanceProfile={profile!r}: use cpu or gpu (python -m infra.acceptance sets "
                "it), or leave it empty for a team stack"
            )
        if profile == "cpu" and self.vm_size not in CPU_ACCEPTANCE:
            raise ConfigError(
                f"vmSize={self.vm_size}: acceptanceProfile cpu runs on the CPU acceptance size; "
                f"use {', '.join(CPU_ACCEPTANCE)}"
            )
        if profile and self.protect_data:
            raise ConfigError(
                f"protectData=true with acceptanceProfile={profile}: an acceptance stack is "
                "destroyed whole, data included; set protectData false"
            )

    def _check_image(self) -> None:
        if self.image_builder not in IMAGE_BUILDERS:
            raise ConfigError(
                f"imageBuilder={self.image_builder!r}: use {' or '.join(IMAGE_BUILDERS)}"
            )
        if self.image_builder == "acr" and not _GIT_URL.match(self.image_source_repo):
            raise ConfigError(
                f"imageSourceRepo={self.image_source_repo!r}: the acr builder clones this "
                "repository; give its https://.../<name>.git URL (or use imageBuilder docker)"
            )
        if not _IMAGE_REF.match(self.image_base):
            raise ConfigError(
                f"imageBase={self.image_base!r}: give <registry>/<repository>:<tag>, "
                "for example nvidia/cuda:13.0.1-devel-ubuntu22.04"
            )
        cuda = cuda_of_base(self.image_base)
        if cuda is not None and cuda != CUDA:
            raise ConfigError(
                f"imageBase={self.image_base}: CUDA {cuda}, but torch's wheel is built for CUDA "
                f"{CUDA}; use a {CUDA}.x base such as nvidia/cuda:13.0.1-devel-ubuntu22.04"
            )
        if self.image_base_digest and not _DIGEST.match(self.image_base_digest):
            raise ConfigError(
                f"imageBaseDigest={self.image_base_digest!r}: give sha256:<64 hex digits> "
                "(docker buildx imagetools inspect <imageBase>) or leave it empty"
            )
        if self.dataset_prefix and not _PREFIX.match(self.dataset_prefix):
            raise ConfigError(
                f"datasetPrefix={self.dataset_prefix!r}: use letters, digits, '.', '_', '-' "
                "and '/' (the folder you uploaded with python -m trainer.data upload)"
            )

    def _check_jobs(self) -> None:
        names = [job.name for job in self.jobs]
        for job in self.jobs:
            if job.nodes > self.max_nodes:
                raise ConfigError(
                    f"jobs.{job.name}.nodes={job.nodes}: the pool has {self.max_nodes} nodes "
                    "(nodeCount + spotNodes); use at most that many"
                )
            job.trainer_settings()  # a bad trainer config stops the plan before any resource
        unknown = sorted(set(self.replace_jobs) - set(names))
        if unknown:
            raise ConfigError(
                f"replaceJobs={list(self.replace_jobs)}: no job named {unknown[0]!r}; the "
                f"stack's jobs are {', '.join(names) or 'none'}"
            )

    def _check_budget(self) -> None:
        _range("budget", self.budget, 0, 10_000_000)
        if not self.budget:
            return
        if self.budget_start_month and not _MONTH.match(self.budget_start_month):
            raise ConfigError(
                f"budgetStartMonth={self.budget_start_month!r}: give the first "
                "month as YYYY-MM, or leave it empty to start in the month it is created"
            )
        # Azure refuses a budget whose period starts before the current one. The start only
        # matters when the budget is created (later changes are ignored, infra/budget.py).
        this_month = current_month()
        if self.budget_start_month and self.budget_start_month < this_month:
            raise ConfigError(
                f"budgetStartMonth={self.budget_start_month}: before the current month "
                f"{this_month}, which Azure refuses for a new budget; leave it empty (the budget "
                "starts in the month it is created and keeps that start)"
            )
        if not self.budget_emails or not all(_EMAIL.match(e) for e in self.budget_emails):
            raise ConfigError(
                f"budgetEmails={list(self.budget_emails)}: a budget needs at least "
                "one valid e-mail address to alert"
            )

    def _check_network(self) -> None:
        vnet = _network("vnetCidr", self.vnet_cidr)
        if not vnet.is_private:
            raise ConfigError(f"vnetCidr={self.vnet_cidr}: must be private (RFC 1918)")
        compute = _network("computeSubnetCidr", self.compute_subnet_cidr)
        storage = _network("storageSubnetCidr", self.storage_subnet_cidr)
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
        if compute.num_addresses - 5 < 2 * self.max_nodes:
            raise ConfigError(
                f"computeSubnetCidr={compute}: too small for {self.max_nodes} "
                "nodes; use a larger range"
            )
        if storage.prefixlen > 28:
            raise ConfigError(f"storageSubnetCidr={storage}: use /28 or larger")
        for ip in self.registry_allowed_ips:
            _network("registryAllowedIps", ip)
        for ip in self.storage_allowed_ips:
            _storage_ip_rule(ip)

    @property
    def nfs_server_ip(self) -> str:
        """The NFS server's static address: the first host Azure does not reserve."""
        return str(ipaddress.ip_network(self.storage_subnet_cidr)[4])


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


@dataclass(frozen=True)
class JobSettings:
    """One training job of the stack: its trainer settings file, its node count, the dataset it
    stages and its Batch priority."""

    name: str
    trainer_config: str
    nodes: int
    dataset_prefix: str = ""
    priority: int = 0

    def trainer_settings(self) -> dict[str, Any]:
        """The trainer YAML, validated by the trainer itself; the keys the job sets removed."""
        from trainer.config import ConfigError as TrainerConfigError
        from trainer.config import TrainConfig

        key = "trainerConfig" if self.name == SHORTHAND_JOB else f"jobs.{self.name}.trainerConfig"
        path = REPO / self.trainer_config
        try:
            values = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"{key}={self.trainer_config}: cannot read ({err})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{key}={self.trainer_config}: must be a mapping")
        try:
            TrainConfig.from_mapping(values)
        except TrainerConfigError as err:
            raise ConfigError(f"{key}={self.trainer_config}: {err}") from None
        job_owned = {"output_dir", "backend"}
        if self.dataset_prefix:
            job_owned |= {"data", "data_dir"}
        return {key: value for key, value in values.items() if key not in job_owned}


def job_settings(values: Mapping[str, Any], given: set[str]) -> tuple[JobSettings, ...]:
    """The stack's jobs: each entry of the ``jobs`` map, or (when the map is empty) the one job
    of ``submitJob``/``trainerConfig``/``datasetPrefix``. Giving both forms is an error."""
    jobs = values["jobs"]
    node_count = values["node_count"] + values["spot_nodes"]
    if not jobs:
        if not values["submit_job"]:
            return ()
        return (
            JobSettings(
                SHORTHAND_JOB, values["trainer_config"], node_count, values["dataset_prefix"]
            ),
        )
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
            raise ConfigError(f"jobs.{name}={entry!r}: give a mapping with trainerConfig")
        unknown = sorted(set(entry) - set(JOB_KEYS))
        if unknown:
            raise ConfigError(
                f"jobs.{name}.{unknown[0]}: unknown; a job takes {', '.join(JOB_KEYS)}"
            )
        trainer_config = entry.get("trainerConfig")
        if not isinstance(trainer_config, str) or not trainer_config:
            raise ConfigError(f"jobs.{name}.trainerConfig: required (a trainer YAML path)")
        nodes = _typed(f"jobs.{name}.nodes", entry.get("nodes", node_count), {"type": "integer"})
        priority = _typed(f"jobs.{name}.priority", entry.get("priority", 0), {"type": "integer"})
        prefix = _typed(
            f"jobs.{name}.datasetPrefix", entry.get("datasetPrefix", ""), {"type": "string"}
        )
        _range(f"jobs.{name}.nodes", nodes, 1, 100)
        # Batch job priorities run from -1000 (lowest) to 1000 (highest).
        _range(f"jobs.{name}.priority", priority, -1000, 1000)
        if prefix and not _PREFIX.match(prefix):
            raise ConfigError(
                f"jobs.{name}.datasetPrefix={prefix!r}: use letters, digits, '.', '_', '-' "
                "and '/' (the folder you uploaded with python -m trainer.data upload)"
            )
        parsed.append(JobSettings(name, trainer_config, nodes, prefix, priority))
    return tuple(parsed)


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


def _storage_ip_rule(text: str) -> None:
    """Storage IP network rules take public IPv4 addresses or ranges of /30 and larger: "/31 or
    /32 are not supported ... use individual IP address rules", and private ranges are not
    allowed (articles/storage/common/storage-network-security-ip-address-range.md)."""
    network = _network("storageAllowedIps", text)
    if "/" in text and network.prefixlen > 30:
        raise ConfigError(
            f"storageAllowedIps={text!r}: Azure storage takes /30 or larger ranges; give the "
            f"address alone ({network.network_address})"
        )
    if not network.is_global:
        raise ConfigError(
            f"storageAllowedIps={text!r}: not a public address; storage IP rules admit public "
            "addresses only (the VNet's subnets are already allowed)"
        )


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
