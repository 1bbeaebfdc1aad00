"""A training job's fields (``JobFields``, the one list of them) and what follows from them alone
(``JobSpec``): its id, which any change of its identity renews, the run folder its settings
resume in, and the URLs of its logs, live metrics, outputs and checkpoint mirror. Pure: the job
provider's host and the commands import it; the payloads Batch receives are ``infra.batch``'s."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Generic, TypeVar

from infra.cloud_init import RUNS_DIR
from infra.trainer_command import trainer_flags

# Where every node mounts the shared file system, under $AZ_BATCH_NODE_MOUNTS_DIR (the pool's
# mountConfiguration, infra/cluster.py).
NFS_RELATIVE_MOUNT = "shared"
# The folder under a job's log folder (``JobSpec.log_url``) where its rank 0 uploads while it
# trains (the trainer command's --metrics-upload-url; infra/live_metrics.py reads it back).
LIVE_FOLDER = "live/"
# A field that is an Azure resource's property: a plain string in a JobSpec, possibly an Output
# of the resource in the job resource's arguments (infra.job.TrainingJobArgs).
S = TypeVar("S")


@dataclass(frozen=True)
class JobFields(Generic[S]):
    """The one list of a job's fields: what the job resource takes and its payloads depend on."""

    stack: str
    endpoint: S  # https://<account>.<region>.batch.azure.com (endpoint_url)
    account_id: S
    pool_id: S
    node_count: int
    vm_size: str
    image_ref: S  # <registry>/trainer:<tag>@sha256:...
    registry_server: S
    node_identity_id: S
    node_identity_client_id: S
    blob_endpoint: S  # https://<account>.blob.core.windows.net/
    # python -m trainer flags of the job's own trainer settings (trainer_settings' flags:
    # infra.trainer_command.trainer_flags), which the job's id and run folder hash
    trainer_args: tuple[str, ...]
    dataset_prefix: str  # "" trains on what trainer_args say; else staged shards
    # A job of the stack's `jobs` map; "" for the one job of the submitJob shorthand. Left out
    # of the hashes below at these defaults, so the shorthand's job id and run folder are the
    # ones stacks had before the jobs map existed (no replaced job on upgrade).
    name: str = ""
    priority: int = 0  # Batch job priority, -1000..1000
    # A job that runs its own command instead of the trainer (trainer_args then empty): its
    # words and how its workers meet (infra.trainer_command.SCRIPT_ENGINES). Left out of the
    # hashes at these defaults, like name and priority.
    command: tuple[str, ...] = ()
    engine: str = ""
    # The SHA-256 of the job's code snapshot (infra.code_snapshot; "" for none): the blob each
    # node fetches, verifies and works in. A changed folder is a changed input, so the preview
    # shows exactly that and the job is replaced; left out of the hashes at its default.
    code_sha256: str = ""
    # How long the job may run, in hours from its creation (Batch's constraints.maxWallClockTime;
    # 0: no limit). Not part of the job's identity: a new limit is applied to the job in place.
    max_wall_clock_hours: int = 0
    # What the job's tasks get to track the run in MLflow (the tracking section's environment:
    # MLFLOW_TRACKING_URI, the stack's workspace's own when it tracks there, and
    # MLFLOW_EXPERIMENT_NAME; () for none). Batch never changes a task's
    # environment (Task - Update takes only its constraints), so a change is a new job; left
    # out of the hashes at its default, and never part of the run folder's name: the new job
    # resumes the run, in MLflow too.
    tracking: tuple[tuple[str, S], ...] = ()
    # The job's own trainer settings as data (infra.trainer_command.JobTrainer), from which the
    # commands are rendered: the same facts as trainer_args, so neither part of the job's
    # identity nor compared by the provider's diff (an older stack's state has none: ``()``).
    trainer_settings: tuple[tuple[str, str | bool], ...] = ()


# Fields a job changes in place (Job - Update) rather than by a new job: neither its id nor
# its run folder depends on them.
NOT_THE_IDENTITY = ("max_wall_clock_hours",)


# Fields that restate others (trainer_settings: the data trainer_args render), so that a job
# whose state predates them is the same job.
RESTATED = ("trainer_settings",)


def wall_clock_limit(hours: int) -> Any:
    """Batch's job constraints for a limit of ``hours`` (None: no limit). "If the Job does not
    complete within the time limit, the Batch service terminates it and any Tasks that are
    still running", termination reason MaxWallClockTimeExpiry, counted from the job's creation
    (Batch REST reference, JobConstraints.maxWallClockTime)."""
    from datetime import timedelta

    from infra.azure_sdk import batch_models as m

    return m.BatchJobConstraints(max_wall_clock_time=timedelta(hours=hours)) if hours else None


def wall_clock_text(hours: float) -> str:
    """A job's wall-clock limit in words (jobs.<name>.maxWallClockHours)."""
    if not hours:
        return "none (maxWallClockHours 0): the job runs until it ends or is cancelled"
    return f"Batch stops the job {hours:g} h after its creation (maxWallClockHours)"


# Job - Get's executionInfo.terminateReason when the limit stopped the job.
WALL_CLOCK_EXPIRY = "MaxWallClockTimeExpiry"


def job_priority(value: Any) -> int:
    """A job's priority as Batch takes it: an int32 in -1000..1000 (Batch REST reference, Job -
    Add). Pulumi's engine hands a dynamic provider every number as a float (protobuf Struct
    numbers are doubles), so ``5.0`` arrives where the stack said 5; sent as is, the job body
    would carry ``"priority": 5.0`` and the job id would hash "5.0" where an int hashes "5"."""
    whole = isinstance(value, int | float) and float(value).is_integer()
    if isinstance(value, bool) or not whole or not -1000 <= value <= 1000:
        raise ValueError(
            f"priority={value!r}: a Batch job priority is a whole number in -1000..1000; "
            "set jobs.<name>.priority to one"
        )
    return int(value)


@dataclass(frozen=True)
class JobSpec(JobFields[str]):
    """Everything the job payloads depend on, as plain values."""

    def __post_init__(self) -> None:
        # One form for every way a spec is made (engine floats, state-file ints, Python code), so
        # the payload is an int32 and the id the one an int priority has always given.
        object.__setattr__(self, "priority", job_priority(self.priority))

    def _identity(self) -> dict[str, Any]:
        values = asdict(self)
        for field_ in fields(self):
            at_default = field_.default is not MISSING and values[field_.name] == field_.default
            if at_default or field_.name in (*NOT_THE_IDENTITY, *RESTATED):
                del values[field_.name]
        return values

    @property
    def settings_render_flags(self) -> bool:
        """Whether the job's trainer settings render its trainer flags. Inputs written by a
        version before jobs carried their settings as data do not (a job's new inputs always
        do): the first `pulumi up` with this version records them, keeping an unchanged job."""
        return trainer_flags(self.trainer_settings) == tuple(self.trainer_args)

    @property
    def job_id(self) -> str:
        """Stable for the same inputs, new for any change (Batch ids cannot be reused at once)."""
        payload = json.dumps(self._identity(), sort_keys=True).encode()
        prefix = f"{self.stack}-{self.name}" if self.name else self.stack
        return f"{prefix}-{hashlib.sha256(payload).hexdigest()[:10]}"[-64:]

    @property
    def run_name(self) -> str:
        script = (*self.command, self.engine) if self.command else ()
        return run_name(self.trainer_args, self.dataset_prefix, self.name, script)

    @property
    def checkpoint_path(self) -> str:
        return run_folder(self.stack, self.run_name)

    @property
    def log_url(self) -> str:
        return f"{self.blob_endpoint.rstrip('/')}/logs/{self.job_id}/"

    @property
    def metrics_url(self) -> str:
        """Where rank 0 uploads metrics.jsonl and the TensorBoard events while it trains."""
        return live_folder_url(self.log_url)

    @property
    def outputs_url(self) -> str:
        """Where rank 0 uploads the finished run's results (trainer.outputs.results): the
        ``outputs`` container (infra.storage.CONTAINERS), under the job's id."""
        return f"{self.blob_endpoint.rstrip('/')}/outputs/{self.job_id}/"

    @property
    def checkpoint_mirror_url(self) -> str:
        """Where rank 0 mirrors the run's checkpoints (trainer.checkpoints.mirror): the
        ``checkpoints`` container (infra.storage.CONTAINERS), under the run folder's own path,
        so that a job of the same settings resumes from it as from the run folder on NFS."""
        return f"{self.blob_endpoint.rstrip('/')}/checkpoints/{self.stack}/{self.run_name}/"

    @property
    def portal_url(self) -> str:
        return f"https://portal.azure.com/#resource{self.account_id}/jobs"

    @classmethod
    def from_props(cls, props: dict[str, Any]) -> JobSpec:
        # A field this version added is absent from older state: its default, as then.
        values = {f.name: props.get(f.name, f.default) for f in fields(cls)}
        values["trainer_args"] = tuple(values["trainer_args"])
        values["trainer_settings"] = tuple(tuple(pair) for pair in values["trainer_settings"] or ())
        values["command"] = tuple(values["command"] or ())
        values["tracking"] = tuple(tuple(pair) for pair in values["tracking"] or ())
        values["node_count"] = int(values["node_count"])
        values["max_wall_clock_hours"] = int(values["max_wall_clock_hours"] or 0)
        return cls(**values)


def run_name(
    trainer_args: Sequence[str], dataset_prefix: str, name: str, script: Sequence[str] = ()
) -> str:
    """Names a job's checkpoint folder: the same training settings (or the same own command
    and engine, ``script``) of the same job resume the same run; two jobs never share one."""
    settings = [tuple(trainer_args), dataset_prefix, *([name] if name else [])]
    settings += [tuple(script)] if script else []
    return hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:12]


def live_folder_url(log_url: str) -> str:
    """The folder under a job's log folder URL where its rank 0 uploads while it trains."""
    return f"{log_url.rstrip('/')}/{LIVE_FOLDER}"


def run_folder(stack: str, run: str) -> str:
    """A run's folder on the shared file system, relative to the node's mounts folder."""
    return f"{NFS_RELATIVE_MOUNT}/{RUNS_DIR}/{stack}/{run}"
