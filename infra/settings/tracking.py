"""The tracking section: the MLflow tracking server every job's rank 0 logs its run to
(``trainer.outputs.tracking``), checked here: an http(s) URL with a host and no credentials (a
password has no place in a stack's config) or an AzureML workspace's azureml:// URI, and the
experiment the stack's runs go in. Whether the stack's own workspace is where they go instead
is a rule across sections (``infra.settings.rules.check_tracking``).

Whether the server answers is the trainer's check, at its start on the nodes (one line, the job
fails before it trains): a server in the stack's network is reached from the nodes, rarely from
where ``pulumi preview`` runs, so preview cannot tell a wrong address from a private one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from infra.settings.checks import ConfigError
from infra.settings.schema import setting
from trainer.outputs.tracking import EXPERIMENT_VARIABLE, URI_VARIABLE, WORKSPACE_ID

SCHEMES = ("http", "https")  # an MLflow tracking server's REST API
# A workspace's tracking URI, as ARM reports it (how-to-use-mlflow-configure-tracking.md, read
# 2026-11-29): azureml://<region>.api.azureml.ms/mlflow/v1.0/<the workspace's ARM id>. The
# image's azureml-mlflow plugin reaches it with the nodes' identity.
AZUREML_PATH = re.compile(rf"^/mlflow/v1\.0{WORKSPACE_ID}/?$", re.IGNORECASE)
# An experiment's name in MLflow's SQL stores: Column(String(256)) (mlflow 3.15.0,
# mlflow/store/tracking/dbmodels/models.py, SqlExperiment.name).
MAX_EXPERIMENT = 256


@dataclass(frozen=True, kw_only=True)
class TrackingSettings:
    """Where the stack's jobs track their runs; ``uri`` "" tracks nothing."""

    uri: str = setting(
        "trackingUri",
        "",
        "MLflow tracking server (an http or https URL the nodes reach, such as a server in the "
        "stack's network: http://10.0.3.4:5000, or an AzureML workspace's azureml:// tracking "
        "URI, whose workspace grants the nodes' identity MLflow's actions) to which every job's "
        "rank 0 logs its settings, metrics, checkpoints' steps and results, in one run per run "
        "folder that a retry or a replaced job resumes; the job's tasks get it as "
        "MLFLOW_TRACKING_URI. Empty tracks nothing, or in the stack's own workspace with "
        "azuremlWorkspace. No credentials in the URL. A change replaces the stack's jobs (a "
        "running one only when listed in replaceJobs).",
    )
    experiment: str = setting(
        "trackingExperiment",
        "",
        "MLflow experiment of the stack's runs (MLFLOW_EXPERIMENT_NAME, created when missing); "
        "empty: the stack's name. Needs trackingUri or azuremlWorkspace.",
    )

    def check(self) -> None:
        if self.uri:
            _check_uri(self.uri)
        name = self.experiment
        if name != name.strip() or len(name) > MAX_EXPERIMENT:
            raise ConfigError(
                f"trackingExperiment={name!r}: give a name of at most {MAX_EXPERIMENT} "
                "characters without leading or trailing spaces, or leave it empty for the stack's"
            )

    def environment(self, stack: str, workspace_uri: Any = None) -> tuple[tuple[str, Any], ...]:
        """What a job's tasks get in their environment: the server's URI, else the stack's
        workspace's (``workspace_uri``, an Output of the workspace), else nothing."""
        uri = self.uri or workspace_uri
        if not uri:
            return ()
        return ((URI_VARIABLE, uri), (EXPERIMENT_VARIABLE, self.experiment or stack))


def _check_uri(uri: str) -> None:
    fix = "give the server's http(s)://<host>:<port>, or leave trackingUri empty to track nothing"
    # Credentials first: no later line may echo a URL that holds them.
    netloc = uri.partition("://")[2].partition("/")[0]
    if "@" in netloc:
        shown = uri.replace(netloc, f"***@{netloc.rpartition('@')[2]}", 1)
        raise ConfigError(
            f"trackingUri={shown!r}: credentials in the URL would sit in the stack's config "
            "and every task's environment; give the URL without them (a server in the stack's "
            "network needs none)"
        )
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - raises ValueError on a port that is not one
    except ValueError as err:
        raise ConfigError(f"trackingUri={uri!r}: not a URL ({err}); {fix}") from None
    if parts.scheme == "azureml":
        if not parts.hostname or not AZUREML_PATH.match(parts.path):
            raise ConfigError(
                f"trackingUri={uri!r}: not a workspace's tracking URI; give what `az ml "
                "workspace show --query mlflow_tracking_uri` prints (azureml://<region>"
                ".api.azureml.ms/mlflow/v1.0/subscriptions/.../workspaces/<name>), or set "
                "azuremlWorkspace to track in the stack's own"
            )
        return
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ConfigError(
            f"trackingUri={uri!r}: the nodes log to an MLflow tracking server over http or "
            "https, or to an AzureML workspace's azureml:// URI (a file or SQLite store would be "
            "each node's own); " + fix
        )
