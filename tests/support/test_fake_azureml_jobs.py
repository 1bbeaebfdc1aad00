"""The fake AzureML jobs API (tests/support/fake_azureml_jobs.py) against what AzureML
documents: a command job of two nodes runs the launcher and the trainer on emulated nodes
through the documented states in order; a job is immutable but for its tags and the like; a
cancel stops its processes; a caller without a role on the workspace is refused; a failed
process fails the job."""

from __future__ import annotations

import shlex
import sys
import time

import psutil
import pytest
import requests

from tests.infra.fake_arm import start_arm
from tests.support.fake_azureml_jobs import IMMUTABLE_MESSAGE, TERMINAL, FakeAzuremlJobs
from tests.support.launchers import mirrored_checkpoints

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

WORKSPACE = (
    "/subscriptions/00000000-0000-0000-0000-00000000abcd/resourceGroups/rg-team-dev/providers/"
    "Microsoft.MachineLearningServices/workspaces/mlw-team-dev"
)
API = {"api-version": "2025-12-01"}


@pytest.fixture
def aml(tmp_path, azurite_entra):
    jobs = FakeAzuremlJobs(tmp_path / "nodes", writers={"writer"}, env=azurite_entra.env())
    server, cert = start_arm(tmp_path, jobs.handle)
    base = f"https://127.0.0.1:{server.server_port}{WORKSPACE}/jobs"

    def call(method: str, name: str, body=None, token: str = "writer", cancel: bool = False):
        url = f"{base}/{name}" + ("/cancel" if cancel else "")
        headers = {"Authorization": f"Bearer {token}"}
        return requests.request(
            method, url, params=API, json=body, headers=headers, verify=str(cert), timeout=30
        )

    yield jobs, call
    server.shutdown()
    server.server_close()


def command_job(command: str, nodes: int = 2, **more) -> dict:
    """A command job of the PyTorch distribution with one process per node."""
    return {
        "properties": {
            "jobType": "Command",
            "command": command,
            "environmentId": f"{WORKSPACE}/environments/trainer/versions/1",
            "computeId": f"{WORKSPACE}/computes/teamgpu1234abcd",
            "distribution": {"distributionType": "PyTorch", "processCountPerInstance": 1},
            "resources": {"instanceCount": nodes},
            **more,
        }
    }


def _launch(token_url: str, *trainer: str) -> str:
    """The launcher over the trainer, as an AzureML job's command."""
    launch = [sys.executable, "-m", "trainer.launch", "--platform", "azureml"]
    launch += ["--token-url", token_url, "--workers-per-node", "1", "--"]
    worker = [sys.executable, "-m", "trainer", "--model", "tiny", "--num-classes", "5"]
    worker += ["--image-size", "16", "--batch-size", "8", "--synthetic-size", "64"]
    worker += ["--loader-workers", "0", "--output-dir", "run", *trainer]
    return shlex.join([*launch, *worker])


def test_a_two_node_job_trains_through_the_documented_states_in_order(aml, azurite_entra, logs):
    jobs, call = aml
    url = azurite_entra.folder_url(logs.container_name, "job-a/")
    created = call("PUT", "job-a", command_job(_launch(url, "--max-steps", "3")))
    assert created.status_code == 201, created.text
    assert created.json()["properties"]["status"] == "NotStarted"
    assert jobs.wait("job-a") == "Completed", jobs.output("job-a")
    assert jobs.history["job-a"] == [
        "NotStarted", "Queued", "Preparing", "Running", "Finalizing", "Completed",
    ]  # fmt: skip
    said = jobs.output("job-a")
    assert "done: step 3 (started at 0, stopped by max_steps), 2 worker(s)" in said, said
    assert call("GET", "job-a").json()["properties"]["status"] == "Completed"


def test_a_job_is_immutable_but_for_its_tags_and_names(aml, azurite_entra, logs):
    jobs, call = aml
    body = command_job("exit 0", nodes=1, tags={"team": "vision"})
    assert call("PUT", "job-b", body).status_code == 201
    jobs.wait("job-b")
    retagged = command_job("exit 0", nodes=1, tags={"team": "vision", "run": "2"})
    assert call("PUT", "job-b", retagged).status_code == 200
    changed = call("PUT", "job-b", command_job("exit 1", nodes=1))
    assert changed.status_code == 400
    assert changed.json()["error"] == {"code": "UserError", "message": IMMUTABLE_MESSAGE}
    assert call("GET", "job-b").json()["properties"]["command"] == "exit 0"


def test_a_cancel_stops_the_jobs_processes_and_ends_it_canceled(aml):
    jobs, call = aml
    assert call("PUT", "job-c", command_job("sleep 600")).status_code == 201
    jobs.wait("job-c", 60, states=("Running",))
    assert call("POST", "job-c", cancel=True).status_code == 202
    assert jobs.wait("job-c", 60) == "Canceled"
    assert "CancelRequested" in jobs.history["job-c"]
    assert all(process.poll() is not None for process in jobs.processes["job-c"])


def test_a_caller_without_a_role_on_the_workspace_is_refused(aml):
    jobs, call = aml
    refused = call("PUT", "job-d", command_job("exit 0"), token="another-operator")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "AuthorizationFailed"
    assert "workspaces/jobs/write" in refused.json()["error"]["message"]
    assert "job-d" not in jobs.jobs


def test_a_process_that_fails_fails_the_job_and_stops_the_others(aml):
    jobs, call = aml
    command = 'if [ "$NODE_RANK" = 1 ]; then exit 3; fi; sleep 600'
    assert call("PUT", "job-e", command_job(command)).status_code == 201
    assert jobs.wait("job-e", 60) == "Failed"
    assert [process.returncode for process in jobs.processes["job-e"]] == [-15, 3]


def test_after_a_killed_worker_fails_a_job_the_next_job_resumes_from_blob(aml, azurite_entra, logs):
    """The nodes share no file system: the run's checkpoints outlive a failed job only in the
    mirror, and the next job of the same run (a new job: AzureML never reruns one) resumes from
    its newest checkpoint on fresh nodes."""
    jobs, call = aml
    mirror = azurite_entra.folder_url(logs.container_name, "checkpoints/run-a/")

    def body(name: str) -> dict:
        token_url = azurite_entra.folder_url(logs.container_name, f"{name}/")
        trainer = ("--max-steps", "30", "--checkpoint-every", "4", "--log-every", "1")
        return command_job(_launch(token_url, *trainer, "--checkpoint-mirror-url", mirror))

    assert call("PUT", "first", body("first")).status_code == 201
    jobs.wait("first", 120, states=("Running", *TERMINAL))
    deadline = time.monotonic() + 120
    while not mirrored_checkpoints(logs):
        running = jobs.history["first"][-1] == "Running"
        assert running and time.monotonic() < deadline, jobs.output("first")
        time.sleep(0.2)
    _trainer_process(jobs.processes["first"][1]).kill()
    assert jobs.wait("first", 60) == "Failed", jobs.output("first")
    mirrored = max(int(name.rsplit("step-", 1)[1][:9]) for name in mirrored_checkpoints(logs))

    assert call("PUT", "second", body("second")).status_code == 201
    assert jobs.wait("second") == "Completed", jobs.output("second")
    said = jobs.output("second")
    assert "resuming from the mirror's step-" in said, said
    done = [line for line in said.splitlines() if line.startswith("done: step 30 (started at ")]
    assert done and int(done[0].split("started at ")[1].split(",")[0]) >= mirrored >= 4, said


def _trainer_process(shell) -> psutil.Process:
    """The worker (``python -m trainer``) under a node's command (bash, then the launcher)."""
    (worker,) = [
        child
        for child in psutil.Process(shell.pid).children(recursive=True)
        if "trainer" in child.cmdline() and "trainer.launch" not in child.cmdline()
    ]
    return worker
