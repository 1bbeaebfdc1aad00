"""``dt-jobs fetch --register NAME``: a finished run's model as a new version of a registered model
in the stack's AzureML workspace, through MLflow's registry (azureml-mlflow: how-to-manage-
models-mlflow.md, read 2026-11-29), with its lineage: the version's source is the results its
run logged (``runs:/<run>/results/step-N``, trainer.outputs.tracking), so the registry links it
to the run's settings, metrics and data; its tags name the job, the image that ran it (the
trainer's code) and the data it read. ``--init-from models:/NAME/VERSION`` starts a run from it
(trainer.checkpoints.init_from)."""

from __future__ import annotations

import os
import re
from typing import Any

from dt_commands.jobs.azureml_jobs import AzureRefused, on_azureml
from dt_commands.stack_outputs import Job, JobsError
from trainer.outputs.tracking import (
    ARTIFACT_FOLDER,
    AZUREML_SCHEME,
    CLIENT_DEFAULTS,
    JOB_TAG,
    QUIET_LOGGERS,
)

# A registered model's name: what the AzureML registry and the models:/ URI accept.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
_STEP = re.compile(rf"^{ARTIFACT_FOLDER}/step-(\d+)$")


def registry_uri(outputs: dict[str, Any], stack: str, name: str) -> str:
    """The workspace's MLflow URI a model is registered at; JobsError (exit 2) before anything
    is downloaded when the name or the stack does not allow it."""
    if not NAME.match(name):
        raise JobsError(
            f"--register={name!r}: a model's name is letters, digits, '.', '_' and '-', from a "
            "letter or digit"
        )
    uri = outputs.get("azureml_tracking_uri")
    if not isinstance(uri, str) or not uri:
        raise JobsError(
            f"stack={stack}: --register needs the stack's AzureML workspace (azuremlWorkspace: "
            "true, or backend: azureml), whose registry holds its models"
        )
    return uri


def mlflow_client(uri: str) -> Any:
    """MLflow's client of ``uri`` with the trainer's client defaults, the plugin's loggers quiet."""
    for key, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if uri.startswith(AZUREML_SCHEME):
        import logging

        for noisy in QUIET_LOGGERS:
            logging.getLogger(noisy).setLevel(logging.ERROR)
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def register(uri: str, outputs: dict[str, Any], job: Job, name: str) -> str:
    """Register the job's run's newest results as a version of ``name``; the line to print."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(uri)
    try:
        run = _run(client, outputs, job)
        folder = _results_folder(client, run.info.run_id, job)
        try:
            client.create_registered_model(name)
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        version = client.create_model_version(
            name,
            source=f"runs:/{run.info.run_id}/{folder}",
            run_id=run.info.run_id,
            tags=_lineage(outputs, job, run),
            description=f"job {job.name} ({job.job_id}), {folder}",
        )
    except MlflowException as err:
        raise AzureRefused(f"{uri}: {str(err).splitlines()[0]}") from None
    return (
        f"registered model {name} version {version.version} from run {run.info.run_id} "
        f"({folder}); start a run from it with --init-from models:/{name}/{version.version}"
    )


def _run(client: Any, outputs: dict[str, Any], job: Job) -> Any:
    """The job's MLflow run: on AzureML the job's own (its name is the run's id); on Batch the
    run its trainer tagged with the Batch job's id."""
    if on_azureml(outputs):
        return client.get_run(job.job_id)
    experiments = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(
        experiments, filter_string=f"tags.`{JOB_TAG}` = '{job.job_id}'", max_results=1
    )
    if not found:
        raise JobsError(
            f"job {job.name} ({job.job_id}): no run in the workspace's MLflow is tagged with it; "
            "the job tracks there when the stack has azuremlWorkspace: true"
        )
    return found[0]


def _results_folder(client: Any, run_id: str, job: Job) -> str:
    """The newest results folder the run logged (``results/step-N``)."""
    steps = [
        (int(match[1]), info.path)
        for info in client.list_artifacts(run_id, ARTIFACT_FOLDER)
        if info.is_dir and (match := _STEP.match(info.path))
    ]
    if not steps:
        raise JobsError(
            f"job {job.name} ({job.job_id}): its run {run_id} has logged no results yet (the "
            "trainer logs them when the run finishes); register it once the job has completed"
        )
    return max(steps)[1]


def _lineage(outputs: dict[str, Any], job: Job, run: Any) -> dict[str, str]:
    """What the version came from, beside its run: the job, the image (the trainer's code), the
    data the run read and where its verified results are."""
    params = run.data.params
    data = ", ".join(f"{k}={params[k]}" for k in ("data", "data_dir") if params.get(k))
    tags = {
        "dt.job": job.job_id,
        "dt.image": str(outputs.get("image_ref") or ""),
        "dt.data": data,
        "dt.results": str(job.outputs.get("outputs_url") or ""),
    }
    return {key: value for key, value in tags.items() if value}
