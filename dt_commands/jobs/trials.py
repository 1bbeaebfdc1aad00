"""``dt-jobs trials``: a sweep's trials on AzureML, best first by its objective: each trial's
state (a trial the sweep's policy stopped is "stopped early"), its last objective value and the
values it was given. Read from the workspace's MLflow with the operator's credential: a sweep's
trials are the child runs of its job's run (``tags.mlflow.parentRunId``), and AzureML's
Canceled is MLflow's KILLED (how-to-track-experiments-mlflow.md, read 2026-11-29)."""

from __future__ import annotations

import argparse
import math
from collections import Counter
from typing import Any

from dt_commands.jobs.azureml_jobs import AzureRefused, on_azureml
from dt_commands.jobs.call import Call
from dt_commands.jobs.model_registry import mlflow_client
from dt_commands.jobs.table import table
from dt_commands.stack_outputs import JobsError, require

NAME = "trials"
HELP = "a sweep's trials on AzureML: state, objective, the values each was given"
MAX_TRIALS = 1000  # infra.settings.sweep.MAX_TRIALS: a sweep has no more


def add_arguments(sub: argparse.ArgumentParser) -> None:
    del sub  # --stack, --outputs-file and --job only


def run(call: Call) -> int:
    job = call.job()
    sweep = job.outputs.get("sweep")
    if not on_azureml(call.outputs) or not isinstance(sweep, dict):
        raise JobsError(
            f"job={job.name}: has no trials; a sweep (jobs.{job.name}.sweep) runs them on the "
            "AzureML backend, and this job is one run (dt-jobs status)"
        )
    uri = require(call.outputs, "azureml_tracking_uri", call.stack)
    sweep_status, runs = _runs(uri, job.job_id)
    cancelled = sweep_status == "KILLED"  # its trials were stopped with it, not by its policy
    rows = [_row(run, sweep, cancelled) for run in runs]
    sign = -1.0 if sweep.get("goal") == "maximize" else 1.0
    rows.sort(key=lambda row: (math.isnan(row[2]), 0.0 if math.isnan(row[2]) else sign * row[2]))
    settings = list(sweep.get("settings") or [])
    header = ("TRIAL", "STATE", str(sweep.get("objective")).upper(), *map(str.upper, settings))
    shown = [header] + [
        (run_id, state, "-" if math.isnan(value) else f"{value:.4g}", *given)
        for run_id, state, value, given in rows
    ]
    call.out.write(table(shown, right={2}))
    counts = Counter(state for _, state, _, _ in rows)
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    state = "cancelled" if cancelled else _state(sweep_status, cancelled)
    call.out.write(f"{len(rows)} trial(s) of sweep {job.job_id} ({state}): {summary}\n")
    return 0


def _runs(uri: str, job_id: str) -> tuple[str, list[Any]]:
    """The sweep's run's MLflow status and its trials' runs; AzureRefused (exit 1) when the
    workspace's MLflow cannot be read."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(uri)
    try:
        parent = client.get_run(job_id)
        runs = client.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{job_id}'",
            max_results=MAX_TRIALS,
        )
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise JobsError(
                f"sweep {job_id}: has no run in the workspace yet (it starts once its job is "
                "created: dt-jobs status)"
            ) from None
        raise AzureRefused(f"{uri}: {str(err).splitlines()[0]}") from None
    return str(parent.info.status), list(runs)


def _state(status: str, cancelled: bool) -> str:
    """A trial's MLflow status in the sweep's words: KILLED is the policy's early stop, or the
    sweep's cancel when the sweep itself was cancelled."""
    if status == "KILLED":
        return "cancelled" if cancelled else "stopped early"
    return {"SCHEDULED": "queued", "RUNNING": "running", "FINISHED": "finished"}.get(
        status, status.lower()
    )


def _row(run: Any, sweep: dict[str, Any], cancelled: bool) -> tuple[str, str, float, list[str]]:
    """(trial, state, its objective's last value or NaN, the values it was given)."""
    objective = run.data.metrics.get(str(sweep.get("objective")))
    value = float(objective) if isinstance(objective, int | float) else math.nan
    given = [str(run.data.params.get(key, "-")) for key in sweep.get("settings") or []]
    return run.info.run_id, _state(run.info.status, cancelled), value, given
