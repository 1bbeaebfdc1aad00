"""A fake AzureML jobs API (ARM's ``.../workspaces/{workspace}/jobs/{name}``, served by
tests/infra/fake_arm.py) whose command jobs run on emulated nodes: each of the job's
``instanceCount`` nodes starts its command in bash ``processCountPerInstance`` times with the
variables AzureML's PyTorch distribution gives (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK,
RANK, LOCAL_RANK: how-to-train-distributed-gpu.md), in a folder of its own (the nodes share no
file system), with the job's environmentVariables.

What it holds to, each read 2026-11-29:
- the states and their order: NotStarted, Queued, Preparing, Running, Finalizing, then
  Completed, Failed or Canceled (JobStatus in @azure/arm-machinelearning; terminal ones:
  azure-sdk-for-python azure/ai/ml/operations/_run_history_constants.py);
- a job is immutable: a PUT of an existing job that changes anything but description, tags,
  displayName, properties and isArchived is a 400 UserError (MicrosoftDocs/azure-docs #122250,
  Azure/azure-sdk-for-python #42156);
- POST .../cancel is accepted (202; REST example Job/cancel.json): CancelRequested, the
  processes stopped, then Canceled;
- a caller without a role on the workspace gets 403 AuthorizationFailed, as ARM answers any;
- a sweep job (jobType Sweep) runs maxTotalTrials trials of its trial command, at most
  maxConcurrentTrials at once, each with a sample of its searchSpace put in for
  ${{search_space.<name>}} (reference-yaml-job-sweep.md; the REST forms of azure-ai-ml's
  search_space.py) and its own MLFLOW_RUN_ID, as a child job named <sweep>_<n>. It evaluates no
  early-termination policy (that needs the trials' metrics in MLflow): every trial runs to its
  end."""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support.ports import free_port

JOB_PATH = re.compile(
    r"^(?P<workspace>/subscriptions/[^/]+/resourceGroups/[^/]+/providers/"
    r"Microsoft\.MachineLearningServices/workspaces/[^/]+)/jobs/(?P<name>[^/]+)(?P<cancel>/cancel)?$"
)
MUTABLE = ("description", "tags", "displayName", "properties", "isArchived")
TERMINAL = ("Completed", "Failed", "Canceled")
IMMUTABLE_MESSAGE = (
    "A job with this name already exists. If you are trying to create a new job, use a "
    "different name. If you are trying to update an existing job, the existing job's Settings, "
    "Inputs, Outputs, Jobs, InputBindings, OutputBindings cannot be changed. Only description, "
    "tags, displayName, properties, and isArchived can be updated."
)


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], Any]:
    return status, {}, {"error": {"code": code, "message": message}}


class FakeAzuremlJobs:
    """The jobs of one fake workspace. ``writers``: the bearer tokens whose callers hold a role
    that writes jobs there; ``hosts``: the emulated nodes' addresses; ``env``: what every
    process also gets (the identity's, a certificate to trust)."""

    def __init__(
        self,
        folder: Path,
        writers: set[str],
        hosts: tuple[str, ...] = ("127.0.0.1", "127.0.0.2"),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.folder, self.writers, self.hosts = folder, writers, hosts
        self.env = dict(env or {})
        self.jobs: dict[str, dict[str, Any]] = {}
        self.history: dict[str, list[str]] = {}  # each job's states, in order
        self.processes: dict[str, list[subprocess.Popen]] = {}
        # Each sweep's trials: (child job's name, its sampled values), in the order they ran.
        self.trials: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self._cancel: dict[str, threading.Event] = {}

    # ---- ARM
    def handle(self, method: str, path: str, query, headers, body) -> tuple[int, dict, Any]:
        found = JOB_PATH.match(path)
        if found is None:
            return _error(404, "NotFound", f"no such resource: {path}")
        token = (headers.get("Authorization") or "").removeprefix("Bearer ")
        if token not in self.writers:
            action = "jobs/write" if method in ("PUT", "POST") else "jobs/read"
            return _error(
                403,
                "AuthorizationFailed",
                "The client does not have authorization to perform action "
                f"'Microsoft.MachineLearningServices/workspaces/{action}' over scope "
                f"'{found['workspace']}' or the scope is invalid.",
            )
        name = found["name"]
        if found["cancel"]:
            return self._cancel_job(name) if method == "POST" else _error(405, "BadRequest", "")
        if method == "PUT":
            return self._put(found["workspace"], name, body or {})
        if method == "GET":
            with self._lock:
                job = self.jobs.get(name)
                return (
                    (200, {}, self._view(name))
                    if job
                    else _error(404, "UserError", f"Job {name} was not found")
                )
        return _error(405, "BadRequest", f"{method} is not served here")

    def _view(self, name: str) -> dict[str, Any]:
        job = self.jobs[name]
        return {**job, "properties": {**job["properties"], "status": self.history[name][-1]}}

    def _put(self, workspace: str, name: str, body: Mapping[str, Any]) -> tuple[int, dict, Any]:
        properties = dict(body.get("properties") or {})
        with self._lock:
            if name in self.jobs:
                old = self.jobs[name]["properties"]
                fixed = lambda p: {k: v for k, v in p.items() if k not in MUTABLE}  # noqa: E731
                if fixed(old) != fixed(properties):
                    return _error(400, "UserError", IMMUTABLE_MESSAGE)
                self.jobs[name]["properties"] = {**old, **properties}
                return 200, {}, self._view(name)
            kind = properties.get("jobType")
            command = (properties.get("trial") or {}) if kind == "Sweep" else properties
            if kind not in ("Command", "Sweep") or not command.get("command"):
                return _error(400, "UserError", "a job needs jobType Command or Sweep, a command")
            self.jobs[name] = {
                "id": f"{workspace}/jobs/{name}",
                "name": name,
                "type": "Microsoft.MachineLearningServices/workspaces/jobs",
                "properties": properties,
            }
            self.history[name] = ["NotStarted"]
            self._cancel[name] = threading.Event()
            created = self._view(name)  # as created, before the job moves on
        run = self._run_sweep if properties.get("jobType") == "Sweep" else self._run
        threading.Thread(target=run, args=(name,), daemon=True).start()
        return 201, {}, created

    def _cancel_job(self, name: str) -> tuple[int, dict, Any]:
        with self._lock:
            if name not in self.jobs:
                return _error(404, "UserError", f"Job {name} was not found")
            if self.history[name][-1] not in TERMINAL:
                self._set(name, "CancelRequested")
                self._cancel[name].set()
        return 202, {"Location": f"/operations/cancel-{name}"}, None

    # ---- the emulated nodes
    def _set(self, name: str, state: str) -> None:
        if self.history[name][-1] != state:
            self.history[name].append(state)

    def _state(self, name: str, state: str) -> bool:
        """Move to ``state`` unless a cancel came; whether the job goes on."""
        with self._lock:
            if self._cancel[name].is_set():
                return False
            self._set(name, state)
            return True

    def _run(self, name: str) -> None:
        properties = self.jobs[name]["properties"]
        for state in ("Queued", "Preparing"):
            if not self._state(name, state):
                return self._end(name, "Canceled")
        processes = self._start(name, properties)
        if not self._state(name, "Running"):
            self._stop(processes)
            return self._end(name, "Canceled")
        while any(p.poll() is None for p in processes) and not self._cancel[name].is_set():
            if any(p.poll() not in (None, 0) for p in processes):
                break  # one process failed: AzureML ends the job's others
            time.sleep(0.1)
        self._stop(processes)
        if self._cancel[name].is_set():
            return self._end(name, "Canceled")
        failed = any(p.returncode != 0 for p in processes)
        self._state(name, "Finalizing")
        self._end(name, "Failed" if failed else "Completed")

    def _run_sweep(self, name: str) -> None:
        """The sweep's trials, ``maxConcurrentTrials`` at a time; Completed once they ended
        (Failed when none of them completed)."""
        properties = self.jobs[name]["properties"]
        limits = properties.get("limits") or {}
        total = int(limits.get("maxTotalTrials") or 1)
        at_once = int(limits.get("maxConcurrentTrials") or 1)
        for state in ("Queued", "Preparing", "Running"):
            if not self._state(name, state):
                return self._end(name, "Canceled")
        rng = random.Random(name)
        self.trials[name] = []
        codes: list[int | None] = []
        for first in range(0, total, at_once):
            batch = []
            for index in range(first, min(total, first + at_once)):
                values = {k: _sample(v, rng) for k, v in properties["searchSpace"].items()}
                trial = dict(properties["trial"])
                for key, value in values.items():
                    trial["command"] = trial["command"].replace(
                        f"${{{{search_space.{key}}}}}", str(value)
                    )
                child = f"{name}_{index}"
                self.trials[name].append((child, values))
                batch += self._start(child, trial, {"MLFLOW_RUN_ID": child})
            while any(p.poll() is None for p in batch) and not self._cancel[name].is_set():
                time.sleep(0.1)
            self._stop(batch)
            codes += [p.returncode for p in batch]
            if self._cancel[name].is_set():
                return self._end(name, "Canceled")
        self._state(name, "Finalizing")
        self._end(name, "Completed" if any(code == 0 for code in codes) else "Failed")

    def _start(
        self, name: str, properties: Mapping[str, Any], more: Mapping[str, str] | None = None
    ) -> list[subprocess.Popen]:
        distribution = properties.get("distribution") or {}
        per_node = int(distribution.get("processCountPerInstance") or 1)
        nodes = int((properties.get("resources") or {}).get("instanceCount") or 1)
        port = free_port(consecutive=2)
        processes = []
        for node in range(nodes):
            where = self.folder / name / f"node{node}"
            where.mkdir(parents=True, exist_ok=True)
            for local in range(per_node):
                variables = {
                    "MASTER_ADDR": self.hosts[0],
                    "MASTER_PORT": str(port),
                    "WORLD_SIZE": str(nodes * per_node),
                    "NODE_RANK": str(node),
                    "RANK": str(node * per_node + local),
                    "LOCAL_RANK": str(local),
                }
                env = {**os.environ, **self.env, **variables, **(more or {})}
                env.update(properties.get("environmentVariables") or {})
                with open(where / f"std_log_process_{local}.txt", "w") as log:
                    processes.append(
                        subprocess.Popen(
                            ["bash", "-c", properties["command"]],
                            cwd=where,
                            env=env,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
        self.processes[name] = processes
        return processes

    @staticmethod
    def _stop(processes: list[subprocess.Popen]) -> None:
        """What AzureML does to a job's processes that still run: SIGTERM, then SIGKILL."""
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def _end(self, name: str, state: str) -> None:
        with self._lock:
            self._set(name, state)

    def wait(self, name: str, seconds: float = 240, states: tuple[str, ...] = TERMINAL) -> str:
        """The job's state once it is one of ``states`` (a bound on a wait that should end)."""
        deadline = time.monotonic() + seconds
        while self.history[name][-1] not in states:
            assert time.monotonic() < deadline, f"job {name}: still {self.history[name]}"
            time.sleep(0.05)
        return self.history[name][-1]

    def output(self, name: str) -> str:
        """Every process's output, node by node (a sweep's: its trials', trial by trial)."""
        folders = [name, *(child for child, _ in self.trials.get(name, []))]
        return "\n".join(
            path.read_text()
            for folder in folders
            for path in sorted((self.folder / folder).glob("node*/std_log_*.txt"))
        )


def _sample(distribution: list[Any], rng: random.Random) -> Any:
    """One value of a search space's distribution in its REST form ([kind, [numbers]], a
    choice's values as one list)."""
    kind, args = distribution
    if kind == "choice":
        return rng.choice(args[0])
    low, high = args[0], args[1]
    if kind == "uniform":
        return rng.uniform(low, high)
    if kind == "loguniform":
        return math.exp(rng.uniform(low, high))
    if kind == "quniform":
        return round(rng.uniform(low, high) / args[2]) * args[2]
    raise ValueError(f"the fake samples no {kind} distribution")
