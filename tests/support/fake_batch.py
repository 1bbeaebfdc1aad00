"""A fake Azure Batch data plane: HTTPS on 127.0.0.1 with a self-signed certificate, answering
the job calls the TrainingJob provider and ``dt-jobs`` (``dt_commands.jobs``) make the way Batch's
REST reference describes them (status codes, JSON bodies, Batch's error JSON), and recording every
request.

It also models what a running job looks like from outside: the multi-instance task's subtasks
on other nodes, the task's and the nodes' files growing while the task runs (read by byte
range), and the pool's resize errors and node states.

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
from urllib.parse import unquote, urlsplit

from tests.support.fake_entra import FakeEntra
from tests.support.replies import send_body, send_json
from tests.support.tls import serve_https

ERROR_MESSAGES = {
    "JobNotFound": "The specified job does not exist.",
    "JobExists": "The specified job already exists.",
    "JobCompleted": "The specified job is already in a completed state.",
    "JobBeingTerminated": "The specified job is already in the process of being terminated.",
    "JobBeingDeleted": "The specified job has been marked for deletion and is being garbage "
    "collected.",
    "TaskExists": "The specified task already exists.",
    "ServerBusy": "The server is currently unable to receive requests. Please retry your request.",
    "AuthorizationFailure": "This request is not authorized to perform this operation.",
    "InvalidPropertyValue": "The value provided for one of the properties is invalid.",
    "AuthenticationFailed": "Server failed to authenticate the request.",
    # Batch REST docs, "Batch Status and Error Codes" (file reads and pools).
    "FileNotFound": "The specified file does not exist.",
    "OperationInvalidForCurrentState": "The specified operation is not valid for the current "
    "state of the resource.",
    "InvalidRange": "The range specified is invalid for the current size of the resource.",
    "InvalidHeaderValue": "The value provided for one of the HTTP headers was not in the correct "
    "format.",
    "PoolNotFound": "The specified pool does not exist.",
    "NodeNotFound": "The specified node does not exist.",
    "TaskNotFound": "The specified task does not exist.",
}
# Where a job's preparation task runs on a node, as Batch reports it (the job's folder under
# workitems; the exact layout is Batch's own, read back from the listing, never built here).
PREPARATION_ROOT = "workitems/job/job-1/jobpreparation"
# Where the primary's coordination command writes (read 2026-11-28). Documented: the application
# command runs on the primary only, after every node's coordination command returned, and a
# subtask's stdout.txt/stderr.txt are in the taskRootDirectory List Subtasks gives (articles/
# batch/batch-mpi.md, "Obtain information about subtasks"); the task's own files are the
# primary's ("methods ... on the multi-instance task itself apply only to the primary"). Not
# documented: where the primary's coordination output goes (neither batch-mpi.md, the REST
# reference's MultiInstanceSettings nor Task - List Task Files say). Both readings are modelled:
# "together", the primary's stdout.txt/stderr.txt hold its coordination output, then its
# application's; "apart", its coordination output is in files of their own in the primary's
# task folder (named here COORDINATION_PREFIX + the stream's name; Batch's name, if any, is
# unknown: clients find them by listing the task's files, never by this name).
COORDINATION_OUTPUTS = ("together", "apart")
COORDINATION_PREFIX = "coordination-"
# The scope azure-batch asks tokens for (azure/batch/_configuration.py).
BATCH_SCOPE = "https://batch.core.windows.net//.default"
# What each role lets a caller do on the account's data plane (articles/batch/batch-role-based-
# access-control.md, read 2026-11-28): Job Submitter holds the actions `pools/read` and the
# data actions `jobs/*`, `jobSchedules/*`; Data Contributor also `pools/*`; Owner and
# Contributor hold every action (`*`), so `pools/*`, but no data action, so no job. Which
# action a node operation needs is not documented: the reading taken (docs/fake-readings.md)
# is that a write to a pool or its nodes (disable scheduling, remove nodes, resize, reboot) is
# `pools/write`, as the built-in roles' own table says of "create, update or delete pools".
BATCH_ROLE_ACTIONS = {
    "Azure Batch Job Submitter": frozenset({"pools/read", "jobs/*", "jobSchedules/*"}),
    "Azure Batch Data Contributor": frozenset(
        {"pools/read", "pools/write", "pools/delete", "jobs/*", "jobSchedules/*"}
    ),
    "Owner": frozenset({"pools/read", "pools/write", "pools/delete"}),
    "Contributor": frozenset({"pools/read", "pools/write", "pools/delete"}),
}


def required_action(method: str, path: str) -> str:
    """The Batch action a request needs."""
    top = path.split("?", 1)[0].strip("/").split("/", 1)[0].lower()
    if top == "jobschedules":
        return "jobSchedules/*"
    if top == "pools":
        if method in ("GET", "HEAD"):
            return "pools/read"
        return "pools/delete" if method == "DELETE" and path.count("/") == 2 else "pools/write"
    return "jobs/*"


# What Batch's data plane answers JSON under.
ODATA_JSON = "application/json;odata=minimalmetadata"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True)
class Raw:
    """A response that is not JSON: a file's bytes (or none, for HEAD) and its headers."""

    body: bytes
    headers: dict[str, str]


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
    # What a terminated job's state reads as once its terminate is done.
    state_after_terminate: str = "completed"
    # Batch's control plane is eventually consistent, and how long its transitions take is not
    # documented, so the fake takes the unfavourable reading of each (see ``transition``):
    # A terminate puts the job in ``terminating`` for this many reads of it (Job - Terminate:
    # "sets the Job to the terminating state ... Then the Job moves into the completed state");
    # another terminate meanwhile is 409 JobBeingTerminated (BatchErrorCode.JobBeingTerminated).
    terminating_reads: int = 1
    # A delete puts the job in ``deleting`` for this many reads of it before it is gone (Job -
    # Delete: "sets the Job to the deleting state"; azure-batch's DeleteJobPollingMethod polls
    # it); meanwhile its id stays taken (409 JobExists) and other calls on it are 409
    # JobBeingDeleted (BatchErrorCode.JobBeingDeleted).
    deleting_reads: int = 2
    # A created job answers this many of the next requests on it with 404 JobNotFound, as a
    # replica that has not seen it yet would: microsoft/CromwellOnAzure #483 retries Job - Get
    # on JobNotFound right after the job's commit for this race. Off by default: tests that
    # assert exact call sequences keep them.
    invisible_after_create: int = 0
    # How an added task reads (Task - Get: state, executionInfo.retryCount).
    task_state: str = "running"
    task_retries: int = 0
    # Where the primary's coordination output goes (COORDINATION_OUTPUTS).
    coordination_output: str = "apart"
    # When set, only access tokens this token service issued for Batch are accepted (401).
    entra: FakeEntra | None = None
    # When set, the bearer tokens of the principals holding a Batch data-plane role; any other
    # caller (a colleague, where the role went to whoever deployed last) gets 403
    # AuthorizationFailure on every call, as Batch answers a caller without a role.
    granted: set[str] | None = None
    # When set, each caller's bearer token -> the roles it holds on the account: a call needing
    # an action none of them holds (``BATCH_ROLE_ACTIONS``) gets the same 403
    # AuthorizationFailure (a permission failure reads so on Batch: Azure/BatchExplorer #2203).
    roles: dict[str, tuple[str, ...]] | None = None
    # Node id -> path under the node's root -> content: what each node's tasks wrote so far.
    node_files: dict[str, dict[str, bytearray]] = field(default_factory=dict)
    # (job id, task id) -> the nodes the multi-instance task runs on, the primary first; unset
    # until the task is scheduled (``place_task``).
    placements: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    task_pools: dict[tuple[str, str], str] = field(default_factory=dict)
    # Pool id -> the pool's JSON (Pool - Get) and its nodes' JSON (Compute Node - List). The
    # stack's pool (infra.cluster.POOL_ID) exists, steady and without errors, unless a test
    # says otherwise.
    pools: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {"ib-gpu": {"id": "ib-gpu", "allocationState": "steady"}}
    )
    pool_nodes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Job id -> each node's job preparation status (Job - List Preparation And Release Task
    # Status). A node whose preparation failed never runs the job's task: "If the Job
    # Preparation Task fails, the Task will return to active and will be eligible to be
    # assigned to a different Compute Node" (BatchTaskState.Preparing), so with every node
    # failed the task waits, active, for as long as the job lives; nothing on the job or the
    # task says why (``prepare_fails``).
    preparations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Hooks that see each request and the fake's answer once it acted on it (commit_then_fail).
    after_commit: list[Callable[[Request, tuple[int, Any]], tuple[int, Any]]] = field(
        default_factory=list
    )

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, list[Any]] = {}  # job id -> [reads left, next state]
        self._unseen: dict[str, int] = {}  # job id -> requests left that do not see it
        fake = self

        class Handler(_Handler):
            batch = fake

        if self.coordination_output not in COORDINATION_OUTPUTS:
            raise ValueError(f"coordination_output: one of {COORDINATION_OUTPUTS}")
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

    # ------------------------------------------------------------------ a running task
    @staticmethod
    def task_root(job_id: str, task_id: str, instance: int) -> str:
        """Where instance ``instance`` (0: the primary) keeps its files on its node. Batch reports
        it as ``nodeInfo.taskRootDirectory``; clients must read it from there, never build it."""
        suffix = "" if instance == 0 else f"_{instance}"
        return f"workitems/{job_id}/job-1/{task_id}{suffix}"

    def place_task(self, job_id: str, task_id: str, nodes: list[str], pool_id: str = "ib-gpu"):
        """Schedule the task: the primary on ``nodes[0]``, one subtask on each other node
        (articles/batch/batch-mpi.md: one primary and numberOfInstances - 1 subtasks, one per
        node). Each instance's stdout.txt and stderr.txt exist from its start, empty."""
        self.placements[(job_id, task_id)] = list(nodes)
        self.task_pools[(job_id, task_id)] = pool_id
        self.pools.setdefault(pool_id, {"id": pool_id, "allocationState": "steady"})
        listed = self.pool_nodes.setdefault(pool_id, [])
        for node in nodes:
            if not any(n["id"] == node for n in listed):
                listed.append({"id": node, "state": "running", "schedulingState": "enabled"})
        for instance, node in enumerate(nodes):
            root = self.task_root(job_id, task_id, instance)
            files = self.node_files.setdefault(node, {})
            for name in ("stdout.txt", "stderr.txt"):
                files.setdefault(f"{root}/{name}", bytearray())
                if instance == 0 and self.coordination_output == "apart":
                    files.setdefault(f"{root}/{COORDINATION_PREFIX}{name}", bytearray())

    def write(
        self,
        job_id: str,
        task_id: str,
        instance: int,
        data: bytes,
        name: str = "stdout.txt",
        command: str = "application",
    ) -> None:
        """Append ``data`` to an instance's file, as its ``command`` writes it: a subtask runs
        the coordination command only; the primary runs both, and where its coordination
        output goes is the fake's reading (``coordination_output``)."""
        node = self.placements[(job_id, task_id)][instance]
        if instance == 0 and command == "coordination" and self.coordination_output == "apart":
            name = COORDINATION_PREFIX + name
        with self._lock:
            path = f"{self.task_root(job_id, task_id, instance)}/{name}"
            self.node_files[node].setdefault(path, bytearray()).extend(data)

    def _node_info(self, job_id: str, task_id: str, instance: int) -> dict[str, Any]:
        node = self.placements[(job_id, task_id)][instance]
        pool = self.task_pools[(job_id, task_id)]
        root = self.task_root(job_id, task_id, instance)
        return {
            "poolId": pool,
            "nodeId": node,
            "nodeUrl": f"{self.url}/pools/{pool}/nodes/{node}",
            "taskRootDirectory": root,
            "taskRootDirectoryUrl": f"{self.url}/pools/{pool}/nodes/{node}/files/{root}",
        }

    def _subtasks(self, job_id: str, task_id: str) -> dict[str, Any]:
        """Task - List Subtasks: every instance but the primary (articles/batch/batch-mpi.md,
        "Obtain information about subtasks": it does not return the primary, ID 0)."""
        nodes = self.placements.get((job_id, task_id), [])
        return {
            "value": [
                {
                    "id": instance,
                    "state": "completed" if self.task_state == "completed" else "running",
                    "nodeInfo": self._node_info(job_id, task_id, instance),
                }
                for instance in range(1, len(nodes))
            ]
        }

    def _file(self, request: Request, node: str, path: str) -> tuple[int, Any]:
        """File - Get / Get Properties (from a task or a node). A HEAD answer has no body, so a
        failed one carries the status alone (RFC 9110 9.3.2). A range is ``ocp-range:
        bytes=first-last`` (last may pass the end: Batch sends up to the end, as Batch
        Shipyard's tail of a running task relies on, Azure/batch-shipyard convoy/batch.py); the
        answer is 200 with those bytes, the only success the REST reference documents (Tasks -
        Get Task File; azure-batch 15.1 accepts nothing else). A first byte at or past the end
        is 416 InvalidRange ("Batch Status and Error Codes")."""
        head = request.method == "HEAD"
        content = self.node_files.get(node, {}).get(path)
        if content is None:
            return (404, None) if head else (404, _error("FileNotFound"))
        data = bytes(content)
        headers = {
            "ocp-batch-file-isdirectory": "False",
            "ocp-batch-file-url": f"{self.url}/files/{path}",
            "ocp-batch-file-mode": "0o100644",
            "ocp-creation-time": "Mon, 23 Nov 2026 10:00:00 GMT",
            "Last-Modified": "Mon, 23 Nov 2026 10:00:00 GMT",
            "Content-Type": "application/octet-stream",
        }
        if head:
            return 200, Raw(b"", {**headers, "Content-Length": str(len(data))})
        wanted = request.headers.get("ocp-range")
        if wanted is not None:
            first, last = _byte_range(wanted)
            if first is None:
                return 400, _error("InvalidHeaderValue")
            if first >= len(data):
                return 416, _error("InvalidRange")
            data = data[first : (len(data) if last is None else last + 1)]
        return 200, Raw(data, headers)

    def _task_file(self, request: Request, job_id: str, task_id: str, name: str):
        """The task's files are the primary's (articles/batch/batch-mpi.md: methods on the
        multi-instance task apply only to the primary). Before the task has a node there are
        none to read: Batch answers 409 OperationInvalidForCurrentState, which Batch Shipyard's
        tail waits out (Azure/batch-shipyard convoy/batch.py, stream_file_and_wait_for_task)."""
        if (job_id, task_id) not in self.placements:
            if request.method == "HEAD":
                return 409, None
            return 409, _error("OperationInvalidForCurrentState")
        node = self.placements[(job_id, task_id)][0]
        return self._file(request, node, f"{self.task_root(job_id, task_id, 0)}/{name}")

    def _task_files(self, job_id: str, task_id: str) -> tuple[int, Any]:
        """Task - List Task Files, not recursive: the primary's task folder, one level (names
        relative to it, as BatchNodeFile.name). Before the task has a node: 409, as a file read
        then (what Batch answers here is not documented; the stricter reading)."""
        if (job_id, task_id) not in self.placements:
            return 409, _error("OperationInvalidForCurrentState")
        node = self.placements[(job_id, task_id)][0]
        root = self.task_root(job_id, task_id, 0) + "/"
        listed = []
        for path, content in sorted(self.node_files.get(node, {}).items()):
            name = path[len(root) :] if path.startswith(root) else ""
            if name and "/" not in name:
                url = f"{self.url}/jobs/{job_id}/tasks/{task_id}/files/{name}"
                properties = {"contentLength": len(content), "fileMode": "0o100644"}
                listed.append(
                    {"name": name, "url": url, "isDirectory": False, "properties": properties}
                )
        return 200, {"value": listed}

    def _pool_route(self, request: Request, parts: list[str]) -> tuple[int, Any]:
        pool = self.pools.get(parts[1])
        if pool is None:
            return (404, None) if request.method == "HEAD" else (404, _error("PoolNotFound"))
        rest = parts[2:]
        if rest == [] and request.method == "GET":
            return 200, pool
        if rest == ["nodes"] and request.method == "GET":
            return 200, {"value": self.pool_nodes.get(parts[1], [])}
        if len(rest) == 2 and rest[0] == "nodes" and request.method == "GET":
            found = [n for n in self.pool_nodes.get(parts[1], []) if n.get("id") == rest[1]]
            return (200, found[0]) if found else (404, _error("NodeNotFound"))
        if len(rest) == 3 and rest[0] == "nodes" and request.method == "POST":
            return self._node_scheduling(parts[1], rest[1], rest[2], request.body)
        if len(rest) >= 4 and rest[0] == "nodes" and rest[2] == "files":
            if not any(n.get("id") == rest[1] for n in self.pool_nodes.get(parts[1], [])):
                return (404, None) if request.method == "HEAD" else (404, _error("NodeNotFound"))
            return self._file(request, rest[1], "/".join(rest[3:]))
        return 404, _error("InvalidPropertyValue")

    def _node_scheduling(self, pool_id: str, node_id: str, action: str, body: Any):
        """Compute Node - Disable Scheduling / Enable Scheduling. Disabling works "only if its
        current scheduling state is enabled" (REST reference, Disable Node Scheduling); the
        error's code is not documented, so the fake's is its own, and a caller reads the
        node's schedulingState first (as Azure/aztk's node scripts do). The option says what
        happens to running tasks: requeue (the default), terminate, taskcompletion."""
        node = next((n for n in self.pool_nodes.get(pool_id, []) if n.get("id") == node_id), None)
        if node is None:
            return 404, _error("NodeNotFound")
        state = node.setdefault("schedulingState", "enabled")
        if action == "disablescheduling":
            option = (body or {}).get("nodeDisableSchedulingOption", "requeue")
            if option not in ("requeue", "terminate", "taskcompletion"):
                return 400, _error("InvalidPropertyValue")
            if state != "enabled":
                return 409, _error("NodeSchedulingAlreadyDisabled")
            node["schedulingState"], node["disabledWith"] = "disabled", option
            return 200, None
        if action == "enablescheduling":
            node["schedulingState"] = "enabled"
            node.pop("disabledWith", None)
            return 200, None
        return 404, _error("InvalidPropertyValue")

    def prepare_fails(self, job_id: str, nodes: list[str], message: str, exit_code: int = 1):
        """The job's preparation task ran and failed on ``nodes`` (its retries used up): the
        task stays active, and only this listing names the nodes and the failure; each node's
        preparation wrote ``message`` last on its stderr.txt, in its ``taskRootDirectory``
        (BatchJobPreparationTaskExecutionInfo: "use this path to retrieve files created by
        the Task, such as log files")."""
        pool = self.pool_nodes.setdefault("ib-gpu", [])
        for node in nodes:
            if not any(n.get("id") == node for n in pool):
                pool.append({"id": node, "state": "idle", "schedulingState": "enabled"})
            stderr = f"{PREPARATION_ROOT}/stderr.txt"
            self.node_files.setdefault(node, {})[stderr] = bytearray(
                b"staging: starting\n" + message.encode() + b"\n"
            )
        self.task_state = "active"
        self.preparations[job_id] = [
            {
                "poolId": "ib-gpu",
                "nodeId": node,
                "jobPreparationTaskExecutionInfo": {
                    "startTime": "2026-11-23T10:01:00Z",
                    "endTime": "2026-11-23T10:02:00Z",
                    "state": "completed",
                    "taskRootDirectory": PREPARATION_ROOT,
                    "exitCode": exit_code,
                    "retryCount": 0,
                    "result": "failure",
                    "failureInfo": {
                        "category": "usererror",
                        "code": "FailureExitCode",
                        "message": "The task exited with an exit code representing a failure",
                    },
                },
            }
            for node in nodes
        ]

    def commit_then_fail(
        self, method: str, path: str, status=503, code="ServerBusy", times: int = 1
    ) -> None:
        """Carry out the next ``times`` ``method path`` requests, then answer ``status``/``code``
        instead of their result: the response is lost after the service acted on the request.
        azure-core's RetryPolicy resends a POST that got 500, 503 or 504 (``_is_method_retryable``
        in azure/core/pipeline/policies/_retry.py), so a job add answered this way is sent again
        and meets the job it made: 409 JobExists, as Azure/azure-sdk-for-net #36549 saw after the
        SDK retried a throttled job add."""
        left = [times]

        def lose(request: Request, answer: tuple[int, Any]) -> tuple[int, Any]:
            if request.method == method and request.path == path and left[0] > 0:
                left[0] -= 1
                return status, _error(code)
            return answer

        self.after_commit.append(lose)

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
            if self.roles is not None:
                action = required_action(request.method, request.path)
                held = self.roles.get(token, ())
                if not any(action in BATCH_ROLE_ACTIONS[role] for role in held):
                    return 403, _error("AuthorizationFailure")
            for fault in self.faults:
                failure = fault(request, self)
                if failure is not None:
                    status, code = failure
                    return status, _error(code) if code else None
            answer = self._route(request)
            for hook in self.after_commit:
                answer = hook(request, answer)
            return answer

    def transition(self, job_id: str, state: str, reads: int, then: str | None) -> None:
        """Put the job in ``state`` for its next ``reads`` reads, then in ``then`` (None: gone)."""
        self.jobs[job_id]["state"] = state
        self._pending[job_id] = [reads, then]

    def hide(self, job_id: str, requests: int) -> None:
        """Answer the next ``requests`` requests on the job 404 JobNotFound."""
        self._unseen[job_id] = requests

    def _read(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """A read of the job moves its pending transition on; None once it is gone."""
        pending = self._pending.get(job["id"])
        if pending is not None:
            if pending[0] <= 0:
                del self._pending[job["id"]]
                if pending[1] is None:
                    del self.jobs[job["id"]]
                    return None
                job["state"] = pending[1]
            else:
                pending[0] -= 1
        return job

    def _route(self, request: Request) -> tuple[int, Any]:
        # The SDK percent-encodes each path segment, a file path's slashes too (%2F).
        parts = [unquote(p) for p in request.path.split("/") if p]
        parts = [piece for p in parts for piece in p.split("/") if piece]
        method = request.method
        if parts[:1] == ["pools"] and len(parts) >= 2:
            return self._pool_route(request, parts)
        if parts == ["jobs"] and method == "POST":
            if not _valid_priority(request.body.get("priority", 0)):
                return 400, _error("InvalidPropertyValue")
            job_id = request.body["id"]
            if job_id in self.jobs:  # a job being deleted still holds its id
                return 409, _error("JobExists")
            self.jobs[job_id] = {**request.body, "state": "active"}
            self.jobs[job_id].setdefault("onAllTasksComplete", "noaction")
            self.jobs[job_id]["creationTime"] = "2026-11-23T10:00:00.0000000Z"
            self.tasks.pop(job_id, None)
            self.hide(job_id, self.invisible_after_create)
            return 201, None
        if len(parts) < 2 or parts[0] != "jobs":
            return 404, _error("InvalidPropertyValue")
        if self._unseen.get(parts[1], 0) > 0:
            self._unseen[parts[1]] -= 1
            return 404, _error("JobNotFound")
        job = self.jobs.get(parts[1])
        rest = parts[2:]
        if job is not None and rest == [] and method == "GET":
            job = self._read(job)
        if job is None:
            return 404, _error("JobNotFound")
        if rest == [] and method == "GET":
            return 200, {"url": f"{self.url}/jobs/{job['id']}", "eTag": "0x1", **job}
        if job["state"] == "deleting" and method != "GET":
            return 409, _error("JobBeingDeleted")
        if rest == [] and method == "PATCH":
            job.update(request.body)
            return 200, None
        if rest == [] and method == "DELETE":
            self.transition(job["id"], "deleting", self.deleting_reads, None)
            return 202, None
        if rest == ["terminate"] and method == "POST":
            if job["state"] == "completed":
                return 409, _error("JobCompleted")
            if job["state"] == "terminating":
                return 409, _error("JobBeingTerminated")
            then = self.state_after_terminate
            self.transition(job["id"], "terminating", self.terminating_reads, then)
            return 202, None
        if rest == ["tasks"] and method == "POST":
            tasks = self.tasks.setdefault(job["id"], [])
            if any(t["id"] == request.body["id"] for t in tasks):
                return 409, _error("TaskExists")
            tasks.append(request.body)
            return 201, None
        task = None
        if len(rest) >= 2 and rest[0] == "tasks":
            task = next((t for t in self.tasks.get(job["id"], []) if t["id"] == rest[1]), None)
            if task is None:
                return (404, None) if method == "HEAD" else (404, _error("TaskNotFound"))
        if len(rest) == 2 and rest[0] == "tasks" and method == "GET":
            info = {"retryCount": self.task_retries, "requeueCount": 0}
            placed = (job["id"], rest[1]) in self.placements
            node = {"nodeInfo": self._node_info(job["id"], rest[1], 0)} if placed else {}
            return 200, {**task, "state": self.task_state, "executionInfo": info, **node}
        if rest == ["jobpreparationandreleasetaskstatus"] and method == "GET":
            return 200, {"value": self.preparations.get(job["id"], [])}
        if rest[2:] == ["subtasksinfo"] and method == "GET":
            return 200, self._subtasks(job["id"], rest[1])
        if rest[2:] == ["files"] and method == "GET":
            return self._task_files(job["id"], rest[1])
        if len(rest) >= 4 and rest[2] == "files" and method in ("GET", "HEAD"):
            return self._task_file(request, job["id"], rest[1], "/".join(rest[3:]))
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
        request_id = {"request-id": str(uuid.uuid4())}
        if isinstance(body, Raw):
            send_body(self, status, body.body, {**request_id, **body.headers})
        else:
            send_json(self, status, body, request_id, content_type=ODATA_JSON)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = do_HEAD = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _valid_priority(value: Any) -> bool:
    """A job's priority as Batch's REST reference types it (Job - Add: ``priority``, int32,
    -1000..1000; the SDKs' own models hold an ``int``): a JSON integer token in range. ``0.0``
    is a JSON number that is not an int32 literal, so the fake refuses it as a strict JSON
    reader of that schema would."""
    return isinstance(value, int) and not isinstance(value, bool) and -1000 <= value <= 1000


def _byte_range(value: str) -> tuple[int | None, int | None]:
    """``bytes=first-last`` or ``bytes=first-`` -> (first, last or None); (None, None) when
    the header is not one range of that form."""
    spec = value.strip().removeprefix("bytes=")
    first, sep, last = spec.partition("-")
    if not sep or not first.isdigit() or (last and not last.isdigit()):
        return None, None
    if last and int(last) < int(first):
        return None, None
    return int(first), int(last) if last else None


def _error(code: str) -> dict[str, Any]:
    """Batch's error body (BatchError in the REST reference)."""
    message = ERROR_MESSAGES.get(code, code)
    return {
        "odata.metadata": "https://batch/$metadata#Microsoft.Azure.Batch.Protocol.Entities"
        ".Container.errors/@Element",
        "code": code,
        "message": {"lang": "en-US", "value": f"{message}\nRequestId:{uuid.uuid4()}"},
    }
