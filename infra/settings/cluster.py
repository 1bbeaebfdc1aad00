"""The pool's section: its size, scaling and Spot, its nodes' disks, and who besides the deployer
submits jobs. Checked here alone; the location, the acceptance size and the jobs against the pool
are rules across sections (``infra.settings.rules``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from infra.settings.checks import ConfigError, in_range
from infra.settings.schema import setting
from infra.sizes import NOT_YET, RETIRED, SUPPORTED, GpuSize, size_of

SCALE_MODES = ("fixed", "autoscale")
# The most nodes a pool or a job takes (nodeCount, jobs.<name>.nodes, a sweep's --nodes).
MAX_NODES = 100
PRINCIPAL_TYPES = ("User", "Group", "ServicePrincipal")
_GUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")


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
    # pool, never beside dedicated nodes (``ClusterSettings._check_spot``).
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

    def check(self, *, cpu_acceptance: bool = False) -> None:
        """Each field alone; ``cpu_acceptance``: the stack is a cpu acceptance stack on the CPU
        size, the one stack that admits a size without InfiniBand GPUs (``StackSettings``)."""
        if self.vm_size in RETIRED or self.vm_size in NOT_YET:
            why = RETIRED.get(self.vm_size) or NOT_YET[self.vm_size]
            raise ConfigError(f"vmSize={self.vm_size}: {why}; use one of {', '.join(SUPPORTED)}")
        if self.vm_size not in SUPPORTED and not cpu_acceptance:
            raise ConfigError(
                f"vmSize={self.vm_size}: not an InfiniBand GPU size we support; "
                f"use one of {', '.join(SUPPORTED)}"
            )
        self._check_spot()
        in_range("nodeCount", self.node_count, 1, MAX_NODES)
        if self.scale_mode not in SCALE_MODES:
            raise ConfigError(f"scaleMode={self.scale_mode!r}: use {' or '.join(SCALE_MODES)}")
        in_range("idleMinutes", self.idle_minutes, 5, 1440)
        # Azure grows an image's OS disk but never shrinks it; 4095 GB is a managed OS disk's
        # largest size (articles/virtual-machines/managed-disks-overview.md).
        in_range("osDiskSizeGb", self.os_disk_size_gb, self.gpu.image.os_disk_gb, 4095)
        if self.job_submitter_type not in PRINCIPAL_TYPES:
            raise ConfigError(
                f"jobSubmitterType={self.job_submitter_type!r}: use {', '.join(PRINCIPAL_TYPES)}"
            )
        if self.job_submitter_object_id and not _GUID.match(self.job_submitter_object_id):
            raise ConfigError(
                f"jobSubmitterObjectId={self.job_submitter_object_id!r}: an Entra "
                "object id is a GUID (az ad group show -g <name> --query id)"
            )

    def _check_spot(self) -> None:
        """Spot is the whole pool or nothing: whether one InfiniBand (multi-instance) task may
        span Spot and dedicated nodes is not documented, and batch-spot-vms.md warns that
        multi-VM MPI jobs suit Spot poorly, as one eviction reruns the whole job (read
        2026-11-28). An evicted run resumes only from a checkpoint."""
        if self.spot and not self.checkpointing:
            raise ConfigError(
                "spot=true with checkpointing=false: Azure evicts Spot nodes at any time and the "
                "job then starts again from step 0; set checkpointing true, or spot false"
            )
