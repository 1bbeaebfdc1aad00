"""The tracking section: the MLflow tracking server every job's rank 0 logs its run to
(``trainer.outputs.tracking``), checked here: an http(s) URL with a host and no credentials (a
password has no place in a stack's config), and the experiment the stack's runs go in.

Whether the server answers is the trainer's check, at its start on the nodes (one line, the job
fails before it trains): a server in the stack's network is reached from the nodes, rarely from
where ``pulumi preview`` runs, so preview cannot tell a wrong address from a private one."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from infra.settings.checks import ConfigError
from infra.settings.schema import setting
from trainer.outputs.tracking import EXPERIMENT_VARIABLE, URI_VARIABLE

SCHEMES = ("http", "https")  # an MLflow tracking server's REST API
# An experiment's name in MLflow's SQL stores: Column(String(256)) (mlflow 3.17.2,
# mlflow/store/tracking/dbmodels/models.py, SqlExperiment.name).
MAX_EXPERIMENT = 256


@dataclass(frozen=True, kw_only=True)
class TrackingSettings:
    """Where the stack's jobs track their runs; ``uri`` "" tracks nothing."""

    uri: str = setting(
        "trackingUri",
        "",
        "MLflow tracking server (an http or https URL the nodes reach, such as a server in the "
        "stack's network: http://10.0.3.4:5000) to which every job's rank 0 logs its settings, "
        "metrics, checkpoints' steps and results, in one run per run folder that a retry or a "
        "replaced job resumes; the job's tasks get it as MLFLOW_TRACKING_URI. Empty tracks "
        "nothing. No credentials in the URL. A change replaces the stack's jobs (a running one "
        "only when listed in replaceJobs).",
    )
    experiment: str = setting(
        "trackingExperiment",
        "",
        "MLflow experiment of the stack's runs (MLFLOW_EXPERIMENT_NAME, created when missing); "
        "empty: the stack's name.",
    )

    def check(self) -> None:
        if not self.uri:
            if self.experiment:
                raise ConfigError(
                    f"trackingExperiment={self.experiment!r} without trackingUri: set "
                    "trackingUri to the MLflow server's URL, or remove trackingExperiment"
                )
            return
        _check_uri(self.uri)
        name = self.experiment
        if name != name.strip() or len(name) > MAX_EXPERIMENT:
            raise ConfigError(
                f"trackingExperiment={name!r}: give a name of at most {MAX_EXPERIMENT} "
                "characters without leading or trailing spaces, or leave it empty for the stack's"
            )

    def environment(self, stack: str) -> tuple[tuple[str, str], ...]:
        """What a job's tasks get in their environment (none without a URI)."""
        if not self.uri:
            return ()
        return ((URI_VARIABLE, self.uri), (EXPERIMENT_VARIABLE, self.experiment or stack))


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
        raise ConfigError(
            f"trackingUri={uri!r}: an AzureML workspace's tracking URI needs the azureml-mlflow "
            "plugin, which the trainer image does not have yet; " + fix
        )
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ConfigError(
            f"trackingUri={uri!r}: the nodes log to an MLflow tracking server over http or "
            "https (a file or SQLite store would be each node's own); " + fix
        )
