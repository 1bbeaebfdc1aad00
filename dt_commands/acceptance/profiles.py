"""The acceptance check's profiles (what runs where) and its checks in order (what each proves):
the dry run lists them, the real run runs them. docs/acceptance.md says what each profile costs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from infra.settings.values import REPO

# Every `pulumi up` of the run applies the program's own policy pack, every guardrail mandatory.
POLICY_PACK = REPO / "policy"


@dataclass(frozen=True)
class Profile:
    name: str
    vm_size: str  # the default; --vm-size picks another InfiniBand size for gpu
    node_count: int
    scale_mode: str
    trainer_config: str
    long_trainer_config: str  # the job `pulumi destroy` must terminate while it runs
    job_minutes: int  # how long the first job may take, pool allocation and image pull included
    assumed_minutes: int  # the whole run, for the dry run's cost line (not a measurement)
    what: str
    target: tuple[int, float] | None = None  # (minutes, USD) the run should stay under
    # The whole run with --image-ref (no build): pool allocation and the image's pull dominate.
    reused_minutes: int = 30


PROFILES = {
    "cpu": Profile(
        "cpu",
        "Standard_D2ds_v5",
        2,
        # The nodes cost little: start them at once instead of waiting for autoscale.
        "fixed",
        "trainer/presets/acceptance-cpu.yaml",
        "trainer/presets/acceptance-cpu-long.yaml",
        60,
        75,
        "2 x Standard_D2ds_v5 (2 vCPUs, no GPU, no InfiniBand), containers, inter-node "
        "communication, one Gloo worker per node",
        (30, 2.0),
    ),
    "gpu": Profile(
        "gpu",
        # The least expensive InfiniBand size in infra/prices.py.
        "Standard_ND96asr_v4",
        2,
        # GPU nodes start when the job is queued, not while the image builds.
        "autoscale",
        "trainer/presets/acceptance-gpu.yaml",
        "trainer/presets/acceptance-gpu-long.yaml",
        90,
        90,
        "2 nodes of an InfiniBand GPU size, one worker per GPU, NCCL over InfiniBand",
        reused_minutes=45,
    ),
}


@dataclass(frozen=True)
class Check:
    key: str
    title: str
    what: str
    skipped: Mapping[str, str] = field(default_factory=dict)  # profile -> why


CHECKS = (
    Check(
        "quota",
        "Batch core quota",
        "a first `pulumi up --target` (policy pack on) creates only the Batch account and what "
        "it depends on; its dedicated cores, in total and for the size's family, must cover "
        "the pool (new accounts may start at 0): a shortfall fails here, before the image "
        "build, the NFS server and the pool",
    ),
    Check(
        "up",
        "pulumi up",
        "the full `pulumi up` with the policy pack (every guardrail mandatory): environment, "
        "image build, training job",
    ),
    Check(
        "outputs",
        "stack outputs",
        "job_id, job_state, job_log_url, job_checkpoint_path, job_portal_url, image_ref "
        "(pinned by digest), vm_size and node_count as configured",
    ),
    Check(
        "job",
        "job completes",
        "the Batch job (polled with the deployer's Entra credential) reaches completed",
    ),
    Check(
        "nodes",
        "exit 0 on every node",
        "the primary task and every subtask exited 0, on as many distinct nodes as the pool "
        "has; each node passed its start task first (waitForSuccess)",
    ),
    Check(
        "logs",
        "logs uploaded",
        "stdout.txt and stderr.txt of the task are in the `logs` container under the job id, "
        "read with the deployer's Entra credential from this machine's IP",
    ),
    Check(
        "workers",
        "every node trained",
        "the primary's report holds every node's launcher log, each node started one worker "
        "per GPU (one on a CPU node), and every node finished",
    ),
    Check(
        "checkpoint",
        "checkpoints on NFS",
        "the trainer wrote its checkpoints (every checkpoint_every steps and the last) under "
        "the run folder job_checkpoint_path, as the task's non-root user",
    ),
    Check(
        "gpu-checks",
        "GPU, driver, InfiniBand",
        "each node's start task checked its GPUs, driver and active InfiniBand ports (a node "
        "failing them never runs a task)",
        {
            "cpu": "no GPU and no InfiniBand on Standard_D2ds_v5; each node's start task prints "
            "'node ok: CPU acceptance profile, GPU and InfiniBand checks skipped'"
        },
    ),
    Check(
        "preflight",
        "NCCL over InfiniBand",
        "the preflight allreduce bus bandwidth is recorded in the log and at or above the "
        "size's floor (70% of its InfiniBand baseline; TCP cannot reach it)",
        {"cpu": "no InfiniBand: Gloo over TCP and no bandwidth floor"},
    ),
    Check(
        "terminate",
        "destroy stops a running job",
        "the job is replaced by a long run (pulumi up with another trainerConfig); once its "
        "task runs, `pulumi destroy --target <the job>` terminates and deletes it",
    ),
    Check(
        "destroy",
        "destroy and remove",
        "`pulumi destroy` removes every resource (protectData false) and the stack is removed",
    ),
)
