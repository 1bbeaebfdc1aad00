"""The stack's settings: ``StackSettings``, the top-level settings (team, region, retention,
acceptance) and one section per component, built by a pure ``from_mapping`` that reads a stack's
values against the schema (``infra.settings.values``), places each in the field that declares it,
and checks them all before anything is declared: the top-level fields here, each section its own
(``check()``), then the rules across sections (``infra.settings.rules``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from infra.cost import CostInputs
from infra.image_inputs import origin_clone_url
from infra.naming import PROJECT, default_tags, tag_problem
from infra.settings.azureml import AzuremlSettings
from infra.settings.budget import BudgetSettings
from infra.settings.checks import ConfigError, in_range
from infra.settings.cluster import ClusterSettings
from infra.settings.image import ImageSettings
from infra.settings.jobs import JobInputs, JobSettings, job_settings
from infra.settings.network import NetworkSettings
from infra.settings.nfs import NfsSettings
from infra.settings.rules import (
    check_acceptance_size,
    check_backend,
    check_image_push,
    check_jobs,
    check_location,
    check_subnet_room,
    check_tracking,
)
from infra.settings.schema import declared, setting
from infra.settings.secrets import SECRET_SETTINGS, SecretSettings
from infra.settings.tracking import TrackingSettings
from infra.settings.values import known_values, load_schema, schema_type, typed_values
from infra.sizes import CPU_ACCEPTANCE

# "" for team stacks; the throwaway stacks of python -m dt_commands.acceptance say which profile.
ACCEPTANCE_PROFILES = ("", "cpu", "gpu")
_TEAM = re.compile(r"^[a-z][a-z0-9]{1,11}$")
_S = TypeVar("_S")


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
    tracking: TrackingSettings
    azureml: AzuremlSettings
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
        given = known_values(values, schema)
        _check_homes(schema)
        typed = typed_values(given, schema, SECRET_SETTINGS)
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
            tracking=_section(TrackingSettings, typed),
            azureml=_section(AzuremlSettings, typed),
            jobs=jobs,
        )

    def __post_init__(self) -> None:
        """The top-level fields, each section's own, and the rules across them, in this order
        (the first problem is the one reported)."""
        self._check_team()
        self._check_acceptance()
        check_acceptance_size(self.acceptance_profile, self.cluster)
        self.cluster.check(cpu_acceptance=self.cpu_acceptance)
        check_location(self.location, self.cluster)
        self.nfs.check()
        in_range("logRetentionDays", self.log_retention_days, 30, 730)
        # Our bound, not Azure's: a longer history belongs in a copy, not in previous versions.
        in_range("blobVersionDays", self.blob_version_days, 0, 3650)
        in_range("checkpointVersionDays", self.checkpoint_version_days, 0, 3650)
        self.budget.check()
        self.network.check()
        check_subnet_room(self.network, self.cluster)
        self._check_tags()
        self.image.check()
        check_image_push(self.image, self.network)
        self.tracking.check()
        self.azureml.check()
        check_tracking(self.tracking, self.azureml)
        check_backend(self.azureml, self.acceptance_profile, self.jobs)
        check_jobs(self.jobs, self.cluster, self.network, self.replace_jobs)

    @property
    def cpu_acceptance(self) -> bool:
        """A cpu acceptance stack on the CPU size: the one stack whose pool has no GPUs."""
        return self.acceptance_profile == "cpu" and self.cluster.vm_size in CPU_ACCEPTANCE

    def _check_team(self) -> None:
        if not _TEAM.match(self.team):
            raise ConfigError(
                f"team={self.team!r}: use 2-12 lowercase letters and digits, starting with a "
                "letter (it becomes part of storage account names)"
            )

    def _check_acceptance(self) -> None:
        profile = self.acceptance_profile
        if profile not in ACCEPTANCE_PROFILES:
            raise ConfigError(
                f"acceptanceProfile={profile!r}: use cpu or gpu (python -m "
                "dt_commands.acceptance sets it), or leave it empty for a team stack"
            )
        if profile and self.protect_data:
            raise ConfigError(
                f"protectData=true with acceptanceProfile={profile}: an acceptance stack is "
                "destroyed whole, data included; set protectData false"
            )

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
        vm_mode = nfs.mode == "vm" and not self.azureml.on_azureml  # AzureML: no NFS server
        share = nfs.mode != "vm" and not self.azureml.on_azureml
        return CostInputs(
            gpu_size=cluster.vm_size,
            nodes=cluster.node_count,
            spot=cluster.spot,
            always_on=cluster.scale_mode == "fixed",
            nfs_vm_size=nfs.vm_size if vm_mode else None,
            nfs_disk_gb=nfs.disk_count * nfs.disk_size_gb if vm_mode else 0,
            files_share_gb=nfs.share_quota_gb if share else 0,
            own_registry=not self.image.ref,
            azureml_workspace=self.azureml.declares_workspace,
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
    TrackingSettings,
    AzuremlSettings,
    JobInputs,
)


def _check_homes(schema: Mapping[str, Any]) -> None:
    """Every setting of the schema has a field that declares it (a program error otherwise)."""
    homeless = sorted(set(schema) - {d.key for cls in DECLARING for _, d in declared(cls)})
    if homeless:
        raise TypeError(f"settings with no home in StackSettings: {', '.join(homeless)}")


def _fields(cls: type, typed: Mapping[str, Any]) -> dict[str, Any]:
    """The declared fields of ``cls`` from the typed values (lists become tuples)."""
    return {
        f.name: tuple(typed[d.key]) if isinstance(typed[d.key], list) else typed[d.key]
        for f, d in declared(cls)
    }


def _section(cls: type[_S], typed: Mapping[str, Any], **overrides: Any) -> _S:
    return cls(**{**_fields(cls, typed), **overrides})


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
