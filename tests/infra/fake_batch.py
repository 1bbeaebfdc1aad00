"""A fake Azure Batch data plane: HTTPS on 127.0.0.1 with a self-signed certificate, answering
the job calls the TrainingJob provider and ``infra.tools.ops`` make the way Batch's REST reference
describes them (status codes, JSON bodies, Batch's error JSON), and recording every request.

Used in-process (a real ``azure.batch.BatchClient`` with ``connection_verify``) and by the
dynamic-provider host in another process (trusting ``ca_path`` through REQUESTS_CA_BUNDLE).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.fake_entra import FakeEntra
from tests.tls import serve_https

ERROR_MESSAGES = {
    "JobNotFound": "The specified job does not exist.",
    "JobExists": "The specified job already exists.",
    "JobCompleted": "The specified job is already in a completed state.",
    "AuthorizationFailure": "This request is not authorized to perform this operation.",
    "InvalidPropertyValue": "The value provided for one of the properties is invalid.",
    "AuthenticationFailed": "Server failed to authenticate the request.",
}
# The scope azure-batch asks tokens for (azure/batch/_configuration.py).
BATCH_SCOPE = "https://batch.core.windows.net//.default"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any


# A fault hook gets each request and the fake; (status, Batch error code or None for no body)
# answers it instead of the fake's own logic.
Fault = Callable[[Request, "FakeBatch"], "tuple[int, str | None] | None"]


@dataclass
class FakeBatch:
    folder: Path
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    # What a terminated job's state reads as right after the terminate call.
    state_after_terminate: str = "completed"
    # How an added task reads (Task - Get: state, executionInfo.retryCount).
    task_state: str = "running"
    task_retries: int = 0
    # When set, only access tokens this token service issued for Batch are accepted (401).
    entra: FakeEntra | None = None
    # When set, the bearer tokens of the principals holding a Batch data-plane role; any other
    # caller (a colleague, where the role went to whoever deployed last) gets 403
    # AuthorizationFailure on every call, as Batch answers a caller without a role.
    granted: set[str] | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        fake = self

        class Handler(_Handler):
            batch = fake

        self._server, self.ca_path = serve_https(Handler, self.folder, "fake-batch")
        self.url = f"https://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def calls(self) -> list[str]:
        """``METHOD /path`` of every request, in order."""
        return [f"{r.method} {r.path}" for r in self.requests]

    def add_job(self, job_id: str, state: str = "active") -> None:
        self.jobs[job_id] = {"id": job_id, "state": state, "onAllTasksComplete": "noaction"}

    def fail(self, method: str, path: str, status: int, code: str, times: int = 1) -> None:
        """Answer the next ``times`` ``method path`` requests with ``status``/``code``."""
        left = [times]

        def fault(request: Request, _fake: FakeBatch) -> tuple[int, str | None] | None:
            if request.method == method and request.path == path and left[0] > 0:
                left[0] -= 1
                return status, code
            return None

        self.faults.append(fault)

    def answer(self, request: Request) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(request)
            token = request.headers.get("authorization", "").removeprefix("Bearer ")
            if self.entra is not None and not self.entra.accepts(token, BATCH_SCOPE):
                return 401, _error("AuthenticationFailed")
            if self.granted is not None and token not in self.granted:
                return 403, _error("AuthorizationFailure")
            for fault in self.faults:
                failure = fault(request, self)
                if failure is not None:
                    status, code = failure
                    return status, _error(code) if code else None
            return self._route(request)

    def _route(self, request: Request) -> tuple[int, Any]:
        parts = [p for p in request.path.split("/") if p]
        method = request.method
        if parts == ["jobs"] and method == "POST":
            if not _valid_priority(request.body.get("priority", 0)):
                return 400, _error("InvalidPropertyValue")
            job_id = request.body["id"]
            if job_id in self.jobs:
                return 409, _error("JobExists")
            self.jobs[job_id] = {**request.body, "state": "active"}
            self.jobs[job_id].setdefault("onAllTasksComplete", "noaction")
            return 201, None
        if len(parts) < 2 or parts[0] != "jobs":
            return 404, _error("InvalidPropertyValue")
        job = self.jobs.get(parts[1])
        if job is None:
            return 404, _error("JobNotFound")
        rest = parts[2:]
        if rest == [] and method == "GET":
            return 200, {"url": f"{self.url}/jobs/{job['id']}", "eTag": "0x1", **job}
        if rest == [] and method == "PATCH":
            job.update(request.body)
            return 200, None
        if rest == [] and method == "DELETE":
            del self.jobs[job["id"]]
            return 202, None
        if rest == ["terminate"] and method == "POST":
            if job["state"] == "completed":
                return 409, _error("JobCompleted")
            job["state"] = self.state_after_terminate
            return 202, None
        if rest == ["tasks"] and method == "POST":
            self.tasks.setdefault(job["id"], []).append(request.body)
            return 201, None
        if len(rest) == 2 and rest[0] == "tasks" and method == "GET":
            task = next((t for t in self.tasks.get(job["id"], []) if t["id"] == rest[1]), None)
            if task is None:
                return 404, _error("TaskNotFound")
            info = {"retryCount": self.task_retries, "requeueCount": 0}
            return 200, {**task, "state": self.task_state, "executionInfo": info}
        return 404, _error("InvalidPropertyValue")


class _Handler(BaseHTTPRequestHandler):
    batch: FakeBatch
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        request = Request(
            self.command,
            url.path,
            url.query,
            {k.lower(): v for k, v in self.headers.items()},
            json.loads(raw) if raw else None,
        )
        status, body = self.batch.answer(request)
        payload = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("request-id", str(uuid.uuid4()))
        self.send_header("Content-Length", str(len(payload)))
        if payload:
            self.send_header("Content-Type", "application/json;odata=minimalmetadata")
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _valid_priority(value: Any) -> bool:
    """A job's priority as Batch's REST reference types it (Job - Add: ``priority``, int32,
    -1000..1000; the SDKs' own models hold an ``int``): a JSON integer token in range. ``0.0``
    is a JSON number that is not an int32 literal, so the fake refuses it as a strict JSON
    reader of that schema would."""
    return isinstance(value, int) and not isinstance(value, bool) and -1000 <= value <= 1000


def _error(code: str) -> dict[str, Any]:
    """Batch's error body (BatchError in the REST reference)."""
    message = ERROR_MESSAGES.get(code, code)
    return {
        "odata.metadata": "https://batch/$metadata#Microsoft.Azure.Batch.Protocol.Entities"
        ".Container.errors/@Element",
        "code": code,
        "message": {"lang": "en-US", "value": f"{message}\nRequestId:{uuid.uuid4()}"},
    }
