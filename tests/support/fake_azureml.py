"""A fake AzureML workspace's data plane on 127.0.0.1 over TLS, for the trainer's tracking
through Microsoft's azureml-mlflow plugin, answering as the workspace does (azureml-mlflow
1.62.0.post6's clients and AzureML's docs, read 2026-11-29):

- The workspace's MLflow API is ``https://<host>/mlflow/v2.0<workspace scope>/api/2.0/mlflow/``
  (the plugin's AzureMLAbstractRestStore for MLflow 3 clients); a real ``mlflow server`` answers
  behind it here.
- A run's ``artifact_uri`` is ``azureml://experiments/<experiment name>/runs/<run id>/artifacts``
  (what AzureML returns; MicrosoftDocs examples load models from such URIs). The plugin uploads an
  artifact by asking the run history service for an empty artifact and its content URI
  (``/history/v1.0<scope>/experiments/<name>/runs/<id>/artifacts/batch/metadata``), a SAS URL in
  the workspace's storage, then writing the blob there: a container of Azurite here. An
  artifact is never overwritten: a path the run already has is an error of the batch
  (``UserError: Resource Conflict: ArtifactId ... already exists``, lightly-ai/lightly-train
  #256, a run that logged the same artifact twice on AzureML).
- Metrics arrive asynchronously: the plugin posts a batch to AzureML's own
  ``preview/mlflow/runs/log-batch-async`` and polls ``preview/mlflow/runs/get-run-data-status``
  until the batch ``is_complete`` (its aml_service proto); here a batch is complete from the
  second poll on.
- Every request carries an Entra token for Azure Resource Manager (the plugin asks for
  ``https://management.azure.com/.default``); an expired one is a 401. A caller whose roles on the
  workspace lack MLflow's actions (how-to-use-mlflow-configure-tracking.md, Permissions) is a
  403 ``AuthorizationFailed``: ``writers`` are the principals the stack granted them to, whose
  grant may take ``arriving_after`` requests to arrive (a role "may take up to 30 minutes to
  propagate", the Storage docs say; ARM's own figure is not documented).
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from tests.support.replies import send_json
from tests.support.tls import serve_https

ARM_AUDIENCES = ("https://management.azure.com", "https://management.azure.com/")
ARTIFACTS_CONTAINER = "azureml"  # the workspace storage's container of run artifacts
_ARTIFACT_REQUEST = re.compile(r"^/experiments/([^/]+)/runs/([^/]+)/artifacts/batch/metadata$")


class FakeAzureML:
    """The workspace ``scope`` on a TLS server; ``tracking_uri`` is what ARM reports for it."""

    def __init__(
        self, folder: Path, backend: str, storage: Any, writers: set[str], arriving_after: int = 0
    ) -> None:
        self.scope = (
            "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg-dev/"
            "providers/Microsoft.MachineLearningServices/workspaces/mlw-dev"
        )
        self.backend, self.storage, self.writers = backend, storage, writers
        # A new role assignment takes a while to reach the workspace: each writer's first
        # ``arriving_after`` requests are refused as if it held no role yet.
        self.not_yet = dict.fromkeys(writers, arriving_after)
        self.refusals: list[str] = []  # each refused request's reason, in order
        self.batches: dict[str, int] = {}  # each async batch's id: the status polls it had
        self.created: set[str] = set()  # every artifact id the run history handed out
        self.experiments: dict[str, str] = {}  # each experiment's name, by id, once read
        self.artifacts = storage.container(ARTIFACTS_CONTAINER)
        if not self.artifacts.exists():
            self.artifacts.create_container()
        fake = self

        class Handler(_Handler):
            workspace = fake

        self.server, self.certificate = serve_https(Handler, folder, name="azureml")

    @property
    def tracking_uri(self) -> str:
        port = self.server.server_address[1]
        return f"azureml://127.0.0.1:{port}/mlflow/v1.0{self.scope}"

    def env(self, bundle: Path) -> dict[str, str]:
        """What a node's task has to track here: the URI, the public cloud by name (the plugin
        otherwise asks ARM's metadata endpoint first), and a CA bundle trusting this server and
        the storage (``bundle``, written here)."""
        bundle.write_bytes(self.certificate.read_bytes() + self.storage.ca_file.read_bytes())
        return {
            "MLFLOW_TRACKING_URI": self.tracking_uri,
            "AZUREML_CURRENT_CLOUD": "AzureCloud",
            "REQUESTS_CA_BUNDLE": str(bundle),
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def refusal(self, authorization: str) -> tuple[int, dict[str, Any]] | None:
        """None for a token AzureML takes; else the status and error it answers."""
        claims = _claims(authorization.removeprefix("Bearer ").strip())
        if claims is None or claims.get("aud") not in ARM_AUDIENCES:
            return self._refuse(401, "InvalidAuthenticationToken", "no token for ARM")
        if float(claims.get("exp", 0)) <= time.time():
            return self._refuse(401, "ExpiredAuthenticationToken", "the token has expired")
        principal = str(claims.get("oid", ""))
        arriving = self.not_yet.get(principal, 0)
        if arriving:
            self.not_yet[principal] = arriving - 1
        if principal not in self.writers or arriving:
            return self._refuse(
                403,
                "AuthorizationFailed",
                f"The client '{principal}' does not have authorization to perform action "
                "'Microsoft.MachineLearningServices/workspaces/experiments/runs/write' over "
                f"scope '{self.scope}'",
            )
        return None

    def _refuse(self, status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
        self.refusals.append(code)
        return status, {"error": {"code": code, "message": message}}

    def empty_artifacts(self, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """The run history's answer to batch/metadata: each path's blob and a SAS to write it."""
        from azure.storage.blob import BlobSasPermissions, generate_blob_sas

        from tests.conftest import DEV_ACCOUNT, DEV_KEY

        container = f"dcid.{run_id}"
        artifacts, content, errors = {}, {}, {}
        for entry in body.get("paths") or []:
            path = entry["path"]
            blob = f"ExperimentRun/{container}/{path}"
            if blob in self.created:
                message = f"Resource Conflict: ArtifactId {blob} already exists."
                errors[path] = {"error": {"code": "UserError", "message": message}}
                continue
            self.created.add(blob)
            sas = generate_blob_sas(
                DEV_ACCOUNT, ARTIFACTS_CONTAINER, blob, account_key=DEV_KEY,
                permission=BlobSasPermissions(create=True, write=True),
                expiry=datetime.now(UTC) + timedelta(hours=1),
            )  # fmt: skip
            where = {"origin": "ExperimentRun", "container": container, "path": path}
            artifacts[path] = {"artifactId": f"ExperimentRun/{container}/{path}", **where}
            content[path] = {
                "contentUri": f"{self.storage.blob_endpoint}/{ARTIFACTS_CONTAINER}/{blob}?{sas}",
                **where,
            }
        return {"artifacts": artifacts, "artifactContentInformation": content, "errors": errors}

    def log_batch_async(self, body: bytes | None) -> tuple[int, Any]:
        """The batch, stored as MLflow's log-batch stores it, and the id its status is asked by."""
        status, answer = _call(f"{self.backend}/api/2.0/mlflow/runs/log-batch", "POST", "", body)
        if status != 200:
            return status, answer
        batch = f"batch-{len(self.batches) + 1}"
        self.batches[batch] = 0
        return 200, {"batch_tracking_id": batch}

    def run_data_status(self, query: str) -> tuple[int, Any]:
        batch = parse_qs(query).get("batch_tracking_id", [""])[0]
        if batch not in self.batches:
            return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": batch}
        self.batches[batch] += 1
        return 200, {"is_complete": self.batches[batch] > 1}

    def experiment_name(self, experiment_id: str) -> str:
        if experiment_id not in self.experiments:
            answer = _call(f"{self.backend}/api/2.0/mlflow/experiments/get", "GET",
                           f"experiment_id={experiment_id}", None)[1]  # fmt: skip
            self.experiments[experiment_id] = answer["experiment"]["name"]
        return self.experiments[experiment_id]

    def with_azureml_artifacts(self, answer: Any) -> Any:
        """The backend's runs with the artifact URIs AzureML gives them."""
        runs = [answer["run"]] if "run" in answer else answer.get("runs", [])
        for run in runs:
            info = run["info"]
            name = self.experiment_name(info["experiment_id"])
            info["artifact_uri"] = f"azureml://experiments/{name}/runs/{info['run_id']}/artifacts"
        return answer


class _Handler(BaseHTTPRequestHandler):
    workspace: FakeAzureML

    def log_message(self, *args: object) -> None:
        pass

    def _serve(self) -> None:
        ws = self.workspace
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        refused = ws.refusal(self.headers.get("Authorization", ""))
        if refused is not None:
            send_json(self, *refused)
            return
        mlflow = f"/mlflow/v2.0{ws.scope}/api/"
        history = f"/history/v1.0{ws.scope}"
        preview = f"/mlflow/v2.0{ws.scope}/api/2.0/preview/mlflow/runs/"
        if path == preview + "log-batch-async":
            send_json(self, *ws.log_batch_async(body))
            return
        if path == preview + "get-run-data-status":
            send_json(self, *ws.run_data_status(query))
            return
        if path.startswith(mlflow):
            target = f"{ws.backend}/api/{path.removeprefix(mlflow)}"
            status, answer = _call(target, self.command, query, body)
            if status == 200 and "/runs/" in path:
                answer = ws.with_azureml_artifacts(answer)
            send_json(self, status, answer)
            return
        asked = _ARTIFACT_REQUEST.match(path.removeprefix(history))
        if path.startswith(history) and asked and self.command == "POST":
            send_json(self, 200, ws.empty_artifacts(asked.group(2), json.loads(body or b"{}")))
            return
        send_json(self, 404, {"error": {"code": "NotFound", "message": path}})

    do_GET = do_POST = do_PATCH = do_DELETE = _serve


def _call(url: str, method: str, query: str, body: bytes | None) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}?{query}" if query else url, data=body, method=method,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        text = err.read()
        try:
            return err.code, json.loads(text or b"{}")
        except ValueError:  # the backend's own error page
            return err.code, {"error_code": "INTERNAL_ERROR", "message": text.decode()[:500]}


def _claims(token: str) -> dict[str, Any] | None:
    try:
        part = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (IndexError, ValueError):
        return None
