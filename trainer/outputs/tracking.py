"""Rank 0's record of the run in MLflow, when ``MLFLOW_TRACKING_URI`` is set: the settings as
parameters, every logged step's numbers as metrics, the checkpoints' steps, and at the end the
results folder as artifacts under the step the run ended at (an AzureML workspace never
overwrites an artifact: "Resource Conflict: ArtifactId ... already exists", lightly-ai/
lightly-train #256). The run is named after the Batch job that starts it (else its output
folder) and keyed by where its checkpoints live (``run_identity``): whatever resumes them goes
on in the same MLflow run. A run the environment gives (``MLFLOW_RUN_ID``: an AzureML job's
own) is the one logged to, tagged with that key, and ended by its giver. A store that cannot
be reached stops the run before it trains, in one line; a failure later is one warning and
the training goes on without tracking.

MLflow's own client (``mlflow-skinny``) talks to a tracking server, an AzureML workspace
(``azureml://``, through the azureml-mlflow plugin) or, locally, SQLite; current MLflow refuses
the file store without an opt-in."""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trainer.common.errors import ConfigError, first_line
from trainer.common.grant_wait import GRANT_WAIT_MINUTES, GrantMissing, GrantWait, Refusal, identity

URI_VARIABLE = "MLFLOW_TRACKING_URI"
# The run the environment gives: an AzureML job is a run, whose id the job's runtime sets with
# the tracking URI (and overrides any given: Azure/azure-sdk-for-python #38813, read
# 2026-11-29). Rank 0 logs into it, and its giver ends it.
RUN_VARIABLE = "MLFLOW_RUN_ID"
EXPERIMENT_VARIABLE = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "distributed-training"
RUN_KEY_TAG = "dt.run_key"  # what a resumed job finds its run by
STOPPED_BY_TAG = "dt.stopped_by"  # why the run's last invocation stopped (epochs, a signal, ...)
JOB_VARIABLE = "AZ_BATCH_JOB_ID"
JOB_TAG = "dt.batch_job"  # the Batch job whose task last ran the run
# MLflow's client retries a request 7 times with a backoff factor of 2 by default (minutes
# before a dead server is reported); the trainer's own defaults, which the environment
# overrides: a run waits seconds, not minutes, to learn that its server is not there. MLflow 3's
# telemetry stays off: rank 0 reports to the stack's store and nowhere else, and its client
# removes a variable from os.environ in a thread while requests iterates it (a KeyError in a
# CI run's search_runs).
CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}
# The records' kinds (trainer.training.run) and the prefix their numbers get in MLflow.
PREFIXES = {"train": "", "eval": "val_", "checkpoint": "checkpoint_", "noise": "noise_"}
AZUREML_SCHEME = "azureml://"
# The role a stack with azuremlWorkspace gives its nodes (infra/workspace.py); how long rank 0
# waits for a new assignment of it to arrive before the run stops.
MLFLOW_ROLE = "MLflow writer"
GRANT_MINUTES = GRANT_WAIT_MINUTES
# What an azureml:// URI's plugin and the SDK log requests and tokens to.
QUIET_LOGGERS = ("azureml", "azure.identity", "azure.core.pipeline.policies.http_logging_policy")
STUDIO = "https://ml.azure.com"
# A workspace's ARM id, as a workspace's tracking URI carries it: /mlflow/v1.0/<this>.
WORKSPACE_ID = (
    r"/subscriptions/[^/]+/resourceGroups/[^/]+/providers/"
    r"Microsoft\.MachineLearningServices/workspaces/[^/]+"
)
_WORKSPACE = re.compile(WORKSPACE_ID, re.IGNORECASE)
ARTIFACT_FOLDER = "results"  # results/step-<the step the run ended at>/
PARAMS_PER_BATCH = 100  # the most one log_batch request may carry (MLflow's REST limits)
PENDING_WRITES = 64  # asynchronous writes held before the oldest are waited for (a long run's)


def artifact_folder(step: int) -> str:
    """Where a run's results at ``step`` go among its artifacts."""
    return f"{ARTIFACT_FOLDER}/step-{step:09d}"


def configured(env: Mapping[str, str] = os.environ) -> str:
    """The tracking URI the environment sets ("" for none)."""
    return env.get(URI_VARIABLE, "").strip()


def run_identity(
    output_dir: str, mirror_url: str = "", env: Mapping[str, str] = os.environ
) -> tuple[str, str]:
    """(the run's name, its key). The name: the Batch job's id (outside a job, the output
    folder's name); a job's folder is named by a hash of its settings, its id by the stack and
    the job's name. The key: where the run's checkpoints live, which is what a run resumes
    from, so one key is one run and two are two: the checkpoint mirror's URL when the run has
    one (every Batch job's does: the same for a node that sees the share at another path, and
    for a retry that resumes from the mirror after the share was lost), else the output
    folder's absolute path."""
    folder = Path(output_dir).absolute()
    name = env.get(JOB_VARIABLE, "").strip() or folder.name
    return name, mirror_url.strip().rstrip("/") or str(folder)


def _tags(key: str, env: Mapping[str, str]) -> dict[str, str]:
    """The run's key, and the Batch job that made it (a replaced job's successor resumes it)."""
    job = env.get(JOB_VARIABLE, "").strip()
    return {RUN_KEY_TAG: key, **({JOB_TAG: job} if job else {})}


class Tracking:
    """One MLflow run, on rank 0. ``start`` finds (or makes) it; ``metrics`` logs a record's
    numbers without waiting for the server; ``finish`` logs the results and ends it."""

    def __init__(
        self, client: Any, run_id: str, resumed: bool, link: str = "", owned: bool = True
    ) -> None:
        self._client, self.run_id, self.resumed = client, run_id, resumed
        self.link = link  # the run's page on a tracking server ("" for a SQLite store)
        # False for the run the environment gave (RUN_VARIABLE): its giver ends it.
        self.owned = owned
        self._pending: list[Any] = []  # the asynchronous writes still under way
        self._broken = ""  # the first failure after the start: tracking stops there

    @classmethod
    def start(
        cls, uri: str, output_dir: str, params: Mapping[str, Any], mirror_url: str = ""
    ) -> Tracking:
        """The job's run (resumed when one has its key), with ``params`` logged when it is new.
        A store that cannot be reached, or refuses, is a ConfigError naming the URI."""
        for key, value in CLIENT_DEFAULTS.items():
            os.environ.setdefault(key, value)
        azureml = uri.startswith(AZUREML_SCHEME)
        if azureml:
            # The plugin and the Azure SDK under it log every request and token at INFO (rank
            # 0 logs INFO); a failure is this module's one line.
            for noisy in QUIET_LOGGERS:
                logging.getLogger(noisy).setLevel(logging.ERROR)
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        where = f"{URI_VARIABLE}={uri}"
        # A workspace's new role for the nodes takes minutes to arrive: its 403 is waited out.
        wait = GrantWait(MLFLOW_ROLE, GRANT_MINUTES, log=print, refusal=WORKSPACE_REFUSAL)
        given = os.environ.get(RUN_VARIABLE, "").strip()
        try:
            client = MlflowClient(tracking_uri=uri)
            if given:
                find = lambda: _join(client, given, output_dir, params, mirror_url)  # noqa: E731
            else:
                find = lambda: _find_or_make(client, output_dir, params, mirror_url)  # noqa: E731
            run_id, resumed, experiment_id = wait.call(find, where) if azureml else find()
        except GrantMissing as err:
            raise ConfigError(str(err)) from None
        except (MlflowException, OSError) as err:
            said = first_line(err)
            if given:
                raise ConfigError(
                    f"{RUN_VARIABLE}={given}: the run the environment gives cannot be logged "
                    f"to at {uri} ({said}); unset {RUN_VARIABLE} to let the trainer find or "
                    "make its run"
                ) from None
            raise ConfigError(_refused(uri, said)) from None
        link = _link(uri, experiment_id, run_id)
        return cls(client, run_id, resumed, link, owned=not given)

    def metrics(self, record: Mapping[str, Any]) -> None:
        """A logged record's numbers at its step (``val_`` for an evaluation's, ``checkpoint_``
        for a checkpoint's, with its step), sent without waiting for the server."""
        if self._broken or "step" not in record:
            return
        from mlflow.entities import Metric

        prefix = PREFIXES.get(str(record.get("kind", "train")))
        if prefix is None:  # per-rank and telemetry records stay in metrics.jsonl
            return
        step, now = int(record["step"]), int(time.time() * 1000)
        # An evaluation's keys carry their prefix already (val_loss: trainer.training.steps).
        values = {
            key if key.startswith(prefix) else f"{prefix}{key}": float(value)
            for key, value in record.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            and key not in ("step", "epoch") and math.isfinite(float(value))
        }  # fmt: skip
        if prefix == "checkpoint_":
            values["checkpoint_step"] = float(step)
        batch = [Metric(key, value, now, step) for key, value in sorted(values.items())]
        self._call(
            "metrics", lambda: self._client.log_batch(self.run_id, metrics=batch, synchronous=False)
        )

    def finish(
        self, results: Path | None, stopped_by: str, step: int, logged_before: bool = False
    ) -> None:
        """The run's end at ``step``: its results folder as artifacts (unless ``logged_before``:
        a rerun of a run that had already ended there, whose results an AzureML workspace
        would refuse to log twice) and FINISHED when it is final; a paused run (a signal,
        --run-steps) is KILLED until its job resumes it."""
        self._wait()
        if results is not None and not logged_before:
            folder = artifact_folder(step)
            self._call(
                "results", lambda: self._client.log_artifacts(self.run_id, str(results), folder)
            )
        self._call("end", lambda: self._client.set_tag(self.run_id, STOPPED_BY_TAG, stopped_by))
        status = "FINISHED" if results is not None else "KILLED"
        if self.owned:
            self._call("end", lambda: self._client.set_terminated(self.run_id, status))

    def failed(self) -> None:
        """The run ended with an error: FAILED (a rerun of the job resumes it); a run the
        environment gave is left to its giver (an AzureML job's ends with the job)."""
        self._wait()
        if self.owned:
            self._call("end", lambda: self._client.set_terminated(self.run_id, "FAILED"))

    def _wait(self) -> None:
        pending, self._pending = self._pending, []
        for operation in pending:
            self._call("metrics", operation.wait)

    def _call(self, what: str, operation: Any) -> None:
        """``operation``, unless tracking already failed; a failure is one warning, then no
        more tracking: the run trains on."""
        if self._broken:
            return
        try:
            result = operation()
        except Exception as err:  # any client failure only ends tracking
            self._broken = first_line(err)
            print(
                f"warning: MLflow tracking stopped ({what}: {self._broken}); the run goes on, "
                "its metrics stay in metrics.jsonl and TensorBoard",
                file=sys.stderr,
                flush=True,
            )
            return
        if hasattr(result, "wait"):
            self._pending.append(result)
        if len(self._pending) > PENDING_WRITES:  # waits only when the server falls behind
            oldest, self._pending = self._pending[:-PENDING_WRITES], self._pending[-PENDING_WRITES:]
            for older in oldest:
                self._call(what, older.wait)


@contextmanager
def tracked(
    output_dir: str, params: Mapping[str, Any], is_root: bool, mirror_url: str = ""
) -> Iterator[Tracking | None]:
    """The run's tracking on rank 0 when ``MLFLOW_TRACKING_URI`` is set (else None), ended as
    FAILED when the block raises; the block calls ``finish`` when it ends well."""
    uri = configured()
    tracking = Tracking.start(uri, output_dir, params, mirror_url) if uri and is_root else None
    if tracking is not None:
        how = "resumed" if tracking.resumed else "new"
        how = how if tracking.owned else f"the environment's ({RUN_VARIABLE})"
        print(f"MLflow: {how} run {tracking.run_id} {tracking.link}".rstrip(), flush=True)
    try:
        yield tracking
    except BaseException:
        if tracking is not None:
            tracking.failed()
        raise


def _find_or_make(
    client: Any, output_dir: str, params: Mapping[str, Any], mirror_url: str
) -> tuple[str, bool, str]:
    """(the run's id, whether it was resumed, its experiment's id): the run with this folder's
    key, RUNNING again with the job's tags, or a new one with ``params``."""
    from mlflow.entities import RunTag

    name, key = run_identity(output_dir, mirror_url)
    experiment_id = _experiment(client, os.environ.get(EXPERIMENT_VARIABLE) or "")
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{_quoted(key)}'", max_results=1
    )
    tags = _tags(key, os.environ)
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        client.log_batch(run_id, tags=[RunTag(tag, value) for tag, value in tags.items()])
        return run_id, True, experiment_id
    run = client.create_run(experiment_id, run_name=name, tags=tags)
    listed = _params(params)
    for first in range(0, len(listed), PARAMS_PER_BATCH):
        client.log_batch(run.info.run_id, params=listed[first : first + PARAMS_PER_BATCH])
    return run.info.run_id, False, experiment_id


def _join(
    client: Any, run_id: str, output_dir: str, params: Mapping[str, Any], mirror_url: str
) -> tuple[str, bool, str]:
    """(``run_id``, whether it already held these settings, its experiment's id): the run the
    environment gave, tagged with this run's key and job, its settings logged once."""
    from mlflow.entities import RunTag

    run = client.get_run(run_id)  # an unknown id raises: the one line names the variable
    _, key = run_identity(output_dir, mirror_url)
    tags = _tags(key, os.environ)
    client.log_batch(run_id, tags=[RunTag(tag, value) for tag, value in tags.items()])
    resumed = bool(run.data.params)
    if not resumed:
        listed = _params(params)
        for first in range(0, len(listed), PARAMS_PER_BATCH):
            client.log_batch(run_id, params=listed[first : first + PARAMS_PER_BATCH])
    return run_id, resumed, run.info.experiment_id


def _workspace_refuses(err: BaseException) -> bool:
    """An AzureML workspace's 403 for an identity without MLflow's actions (yet)."""
    said = first_line(err)
    return "AuthorizationFailed" in said or " 403" in said


WORKSPACE_REFUSAL = Refusal(
    _workspace_refuses,
    "the workspace",
    "the run (403 AuthorizationFailed)",
    lambda role: f"{identity()} lacks {role} (MLflow's actions) on the workspace",
)


def _refused(uri: str, said: str) -> str:
    """The one line for a store that cannot be reached or refuses the run."""
    return (
        f"{URI_VARIABLE}={uri}: the MLflow tracking store cannot be reached or refused the run "
        f"({said}); start it, fix the URI, or unset {URI_VARIABLE} to train without tracking"
    )


def _link(uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page: in a tracking server's web UI (its route: #/experiments/<id>/runs/<id>),
    or in AzureML studio for a workspace's azureml:// URI (the "Web View" link AzureML's own
    tools print: https://ml.azure.com/runs/<run id>?wsid=<workspace's ARM id>); "" for SQLite."""
    if uri.startswith(AZUREML_SCHEME):
        workspace = _WORKSPACE.search(urlsplit(uri).path)
        return f"{STUDIO}/runs/{run_id}?wsid={workspace.group(0)}" if workspace else ""
    if not uri.startswith(("http://", "https://")):
        return ""
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _experiment(client: Any, name: str) -> str:
    name = name or DEFAULT_EXPERIMENT
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)


def _params(settings: Mapping[str, Any]) -> list[Any]:
    """The settings as MLflow parameters (strings; MLflow caps a value at 6,000 characters)."""
    from mlflow.entities import Param

    return [Param(key, str(value)[:6000]) for key, value in sorted(settings.items())]


def _quoted(value: str) -> str:
    """A value inside a search filter's single quotes."""
    return value.replace("\\", "\\\\").replace("'", "\\'")
