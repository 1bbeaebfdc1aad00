"""What a stack job runs on the AzureML backend (``AzuremlJobSpec``): the command of its native
command job, which AzureML starts once per node (a PyTorch distribution of one process per
instance) and which runs the node launcher over the trainer, as Batch's task does; a sweep's
trial command; the variables the job sets. The nodes share no file system: each trains in a
run folder of its working folder, its checkpoints are mirrored to Blob and restored from there
on a resume (trainer.checkpoints.mirror), and a staged dataset is copied to each node first.
Pure: no Pulumi, no Azure SDK.

Read 2026-11-29 (MicrosoftDocs/azure-ai-docs, articles/machine-learning/):
how-to-train-distributed-gpu.md (a PyTorch distribution's variables, one process per instance),
how-to-identity-based-service-authentication.md (a job reaches a user-assigned identity by its
client id), reference-yaml-job-command.md (the name is unique in the workspace, the command runs
in the environment's container)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from infra.job_spec import NOT_THE_IDENTITY, JobSpec, live_folder_url
from infra.trainer_command import JobSet, commands, script_commands, stage_data_command

# The run folder, in each process's working folder (the node's local disk): the nodes share no
# folder, so what must outlive a node (checkpoints, metrics, results) goes to Blob.
RUN_DIR = "run"
# Where a node stages the job's dataset, in the same working folder.
DATASETS_DIR = "datasets"
# A job's code snapshot on the node (trainer.launch.code_folder): kept in the working folder's
# cache, linked as its code folder (the launcher's --code-dir).
CODE_LINK, CODE_CACHE = "code", "code-cache"
# The variable a job's processes find its MLflow experiment by (trainer.outputs.tracking).
EXPERIMENT_VARIABLE = "MLFLOW_EXPERIMENT_NAME"
# A sweep's trial's own MLflow run, which AzureML gives each trial's processes (the trainer joins
# it): the trial's folders are named by it, expanded by the shell on the node.
TRIAL_RUN = "${MLFLOW_RUN_ID}"


@dataclass(frozen=True)
class AzuremlJobSpec(JobSpec):
    """A job of the AzureML backend: the Batch-only fields (endpoint, account, pool, registry
    server, node identity's resource id) are empty, ``tracking`` names the job's experiment.
    AzureML changes nothing of a job once it exists but its tags, description and display name
    (Jobs - Create Or Update), so every other property of it, its wall-clock limit too, is part
    of its name: a change is a new job."""

    # A sweep's settings (infra.settings.sweep.SweepSettings.identity); "" for one run.
    sweep: str = ""

    def _identity(self) -> dict[str, Any]:
        values = super()._identity()
        for name in NOT_THE_IDENTITY:
            if getattr(self, name):
                values[name] = getattr(self, name)
        return values

    @property
    def experiment(self) -> str:
        return dict(self.tracking).get(EXPERIMENT_VARIABLE) or self.stack


def job_set(spec: AzuremlJobSpec) -> JobSet:
    """The values of the trainer settings the job sets itself: a run folder of the node's own,
    the Blob folders of its live metrics, results and checkpoint mirror, the staged data."""
    return JobSet(
        run_dir=RUN_DIR,
        metrics_upload_url=spec.metrics_url,
        outputs_url=spec.outputs_url,
        vm_size=spec.vm_size,
        checkpoint_mirror_url=spec.checkpoint_mirror_url,
        dataset_dir=f"{DATASETS_DIR}/{spec.dataset_prefix}" if spec.dataset_prefix else "",
    )


def launch_command(spec: AzuremlJobSpec, job: JobSet, token_url: str, settings: Any) -> list[str]:
    """``trainer.launch`` on AzureML over the trainer of ``settings`` (or the job's own command):
    the nodes meet through the master's token in ``token_url`` (trainer.launch.token_blob)."""
    if spec.command:
        workers, given = script_commands(spec.command, spec.engine, job)
    else:
        workers, given = commands(settings, job)
    launch = ["python", "-m", "trainer.launch", "--platform", "azureml"]
    launch += ["--token-url", token_url, "--vm-size", spec.vm_size, *given]
    launch += ["--code-dir", CODE_LINK] if spec.code_sha256 else []
    return [*launch, "--", *workers]


def _word(part: str) -> str:
    """One bash word: ``TRIAL_RUN`` in double quotes (expanded on the node), everything else
    single-quoted, so that no value is ever run or expanded."""
    pieces = part.split(TRIAL_RUN)
    return f'"{TRIAL_RUN}"'.join(shlex.quote(piece) if piece else "" for piece in pieces)


def _command(spec: AzuremlJobSpec, launch: list[str]) -> str:
    """The job's code made ready and its dataset staged first when it has them (a failure is
    the node's, with its own line), then the launcher exec'd, so that it receives AzureML's
    SIGTERM of a cancel itself."""
    steps = []
    if spec.code_sha256:
        code = ["python", "-m", "trainer.launch.code_folder", "--account-url", spec.blob_endpoint]
        code += ["--sha256", spec.code_sha256, "--link", CODE_LINK, "--cache-root", CODE_CACHE]
        steps.append(shlex.join(code))
    if spec.dataset_prefix:
        dest = f"{DATASETS_DIR}/{spec.dataset_prefix}"
        steps.append(shlex.join(stage_data_command(spec.blob_endpoint, spec.dataset_prefix, dest)))
    steps.append("exec " + " ".join(_word(word) for word in launch))
    return " && ".join(steps)


def job_command(spec: AzuremlJobSpec) -> str:
    """The job's command as AzureML runs it on every node."""
    launch = launch_command(spec, job_set(spec), spec.log_url, spec.trainer_settings)
    return _command(spec, launch)


def trial_folder(url: str) -> str:
    """A trial's own folder under one of the sweep's (its token, live metrics, results)."""
    return f"{url.rstrip('/')}/trials/{TRIAL_RUN}/"


def trial_command(spec: AzuremlJobSpec, swept: tuple[str, ...]) -> str:
    """A sweep's trial command: the job's command with each swept setting's flag given the
    value AzureML samples for it (``${{search_space.<setting>}}``, which AzureML puts in before
    the command runs), each trial in folders of its own. A trial keeps no checkpoints in Blob:
    it is one sample of the space, never resumed."""
    job = JobSet(
        run_dir=RUN_DIR,
        metrics_upload_url=live_folder_url(trial_folder(spec.log_url)),
        outputs_url=trial_folder(spec.outputs_url),
        vm_size=spec.vm_size,
        dataset_dir=job_set(spec).dataset_dir,
    )
    sampled = tuple((key, f"${{{{search_space.{key}}}}}") for key in swept)
    settings = (*spec.trainer_settings, *sampled)
    return _command(spec, launch_command(spec, job, trial_folder(spec.log_url), settings))


def shm_size(vm_size: str) -> str:
    """The container's /dev/shm, as Batch's nodes give theirs (AzureML's default is 2g)."""
    from infra.batch import CPU_SHM_SIZE, SHM_SIZE
    from infra.sizes import size_of

    return SHM_SIZE if size_of(vm_size).ib_ports else CPU_SHM_SIZE


def environment_variables(spec: AzuremlJobSpec) -> dict[str, str]:
    """What every process of the job gets beside AzureML's own: the nodes' identity by its
    client id (DefaultAzureCredential picks it: the compute may hold several), and its
    experiment."""
    return {"AZURE_CLIENT_ID": spec.node_identity_client_id, **dict(spec.tracking)}
