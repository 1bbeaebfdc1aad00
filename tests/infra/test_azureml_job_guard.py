"""The guard of an AzureML job (infra/azureml_job_guard.py) against the fake AzureML jobs API
behind a fake ARM (tests/support/fake_azureml_jobs.py: the documented states, a cancel that
stops the job's processes, a 403 for a caller without a role): a protected running job is never
replaced, an allowed replacement or a removal cancels the job and waits for its end, an ended
job is left as it is, and a refusal or a missing role is one line."""

from __future__ import annotations

import pytest

from infra import azureml_job_guard as guard_module
from infra import registry as registry_module
from infra.api_versions import sent_at
from infra.azureml_job_guard import (
    JOBS_API_VERSION,
    AzuremlJobGuardProvider,
    JobGuardError,
    job_arm_id,
)
from tests.infra.fake_arm import serving_arm
from tests.support.fake_azureml_jobs import FakeAzuremlJobs

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

WORKSPACE = (
    "/subscriptions/00000000-0000-0000-0000-00000000abcd/resourceGroups/rg-team-dev/providers/"
    "Microsoft.MachineLearningServices/workspaces/mlw-team-dev"
)
TOKEN = "fake-arm-token"  # what serving_arm's credential gives the provider


def test_the_guard_speaks_the_api_version_azure_native_sends_jobs_at():
    assert sent_at("azure-native:machinelearningservices:Job") == JOBS_API_VERSION


@pytest.fixture
def aml(tmp_path, monkeypatch):
    jobs = FakeAzuremlJobs(tmp_path / "nodes", writers={TOKEN})
    with serving_arm(tmp_path, monkeypatch, jobs.handle) as base:
        monkeypatch.setattr(registry_module, "ARM_ENDPOINT", base)
        monkeypatch.setattr(guard_module, "POLL_SECONDS", 0.1)
        yield jobs


def _start(jobs: FakeAzuremlJobs, name: str, command: str = "sleep 120") -> str:
    """A one-node job running ``command``, as the job resource would have created it."""
    body = {"properties": {"jobType": "Command", "command": command, "resources": {}}}
    status, _, _ = jobs.handle("PUT", f"{WORKSPACE}/jobs/{name}", {}, _auth(), body)
    assert status == 201
    return job_arm_id(WORKSPACE, name)


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def _props(job: str, protect: bool = True) -> dict:
    return {"job": job, "label": "train", "protect_running": protect}


def test_a_protected_running_job_is_not_replaced_and_keeps_running(aml):
    old = _start(aml, "dev-train-1")
    aml.wait("dev-train-1", states=("Running",))
    new = job_arm_id(WORKSPACE, "dev-train-2")
    with pytest.raises(JobGuardError) as refused:
        AzuremlJobGuardProvider().diff(old, _props(old), _props(new))
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("job train (dev-train-1) is Running on AzureML, and this change ")
    assert "add train to replaceJobs" in line and "dt-jobs cancel" in line
    assert aml.history["dev-train-1"][-1] == "Running"
    _cancel(aml, "dev-train-1")


def test_an_allowed_replacement_cancels_the_running_job_and_waits_for_its_end(aml):
    old = _start(aml, "dev-train-1")
    aml.wait("dev-train-1", states=("Running",))
    new = job_arm_id(WORKSPACE, "dev-train-2")
    provider = AzuremlJobGuardProvider()
    diff = provider.diff(old, _props(old, protect=False), _props(new, protect=False))
    assert diff.changes and not diff.replaces
    result = provider.update(old, _props(old, protect=False), _props(new, protect=False))
    assert result.outs == _props(new, protect=False)
    # Ended before the update returned, so before the job's replacement is created.
    assert aml.history["dev-train-1"][-2:] == ["CancelRequested", "Canceled"]


def test_an_ended_job_is_replaced_without_a_cancel(aml):
    old = _start(aml, "dev-train-1", command="true")
    assert aml.wait("dev-train-1") == "Completed"
    new = job_arm_id(WORKSPACE, "dev-train-2")
    provider = AzuremlJobGuardProvider()
    assert provider.diff(old, _props(old), _props(new)).changes
    provider.update(old, _props(old), _props(new))
    assert "CancelRequested" not in aml.history["dev-train-1"]
    assert provider.diff(new, _props(new), _props(new)).changes is False


def test_a_job_that_leaves_the_stack_is_cancelled_and_a_gone_one_is_left_alone(aml):
    job = _start(aml, "dev-train-1")
    aml.wait("dev-train-1", states=("Running",))
    AzuremlJobGuardProvider().delete(job, _props(job))
    assert aml.history["dev-train-1"][-1] == "Canceled"
    gone = job_arm_id(WORKSPACE, "never-made")
    AzuremlJobGuardProvider().delete(gone, _props(gone))  # a 404: nothing to stop


def test_a_deployer_without_a_role_on_the_workspace_gets_one_line(aml):
    job = _start(aml, "dev-train-1")
    aml.wait("dev-train-1", states=("Running",))
    aml.writers = set()  # the deployer's role is gone: ARM answers 403
    with pytest.raises(JobGuardError) as refused:
        AzuremlJobGuardProvider().diff(job, _props(job), _props(job_arm_id(WORKSPACE, "x")))
    line = str(refused.value)
    assert line.startswith("could not read AzureML job dev-train-1 (403: ")
    assert "AuthorizationFailed" not in line and "jobs/read" in line
    assert "this credential needs a role on the workspace" in line and "\n" not in line
    aml.writers = {TOKEN}
    _cancel(aml, "dev-train-1")


def _cancel(jobs: FakeAzuremlJobs, name: str) -> None:
    jobs.handle("POST", f"{WORKSPACE}/jobs/{name}/cancel", {}, _auth(), None)
    assert jobs.wait(name) == "Canceled"


def test_an_arm_out_of_reach_is_one_line_not_a_traceback(monkeypatch):
    from azure.core.credentials import AccessToken

    from infra import credentials
    from tests.support.ports import free_port

    class Token:
        def get_token(self, *scopes, **kwargs):
            return AccessToken("t", 4102444800)

    monkeypatch.setattr(credentials, "credential", Token)
    monkeypatch.setattr(registry_module, "ARM_ENDPOINT", f"https://127.0.0.1:{free_port()}")
    job = job_arm_id(WORKSPACE, "dev-train-1")
    with pytest.raises(JobGuardError) as refused:
        AzuremlJobGuardProvider().delete(job, _props(job))
    line = str(refused.value)
    assert line.startswith("could not reach ARM for AzureML job dev-train-1 (")
    assert line.endswith("check the network and `az login`, then try again") and "\n" not in line
