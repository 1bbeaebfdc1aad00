"""``dt-jobs`` on a stack of the AzureML backend, against the fake AzureML jobs API behind a fake
ARM (tests/support/fake_azureml_jobs.py): ``list`` and ``status`` show each job's live state,
``cancel`` stops a running job, an operator without a role on the workspace gets one line (exit
1), and ``keep-out``, which is Batch's, says where to look instead (exit 2). ``logs`` reads what
the launchers copy to Blob: tests/infra/test_azureml_job_run.py runs it after a real job."""

from __future__ import annotations

import json
import re

import pytest

from dt_commands.jobs.main import main
from infra import registry as registry_module
from tests.infra.fake_arm import serving_arm
from tests.support.fake_azureml_jobs import FakeAzuremlJobs

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

WORKSPACE = (
    "/subscriptions/00000000-0000-0000-0000-00000000abcd/resourceGroups/rg-team-dev/providers/"
    "Microsoft.MachineLearningServices/workspaces/mlw-team-dev"
)
TOKEN = "fake-arm-token"  # what serving_arm's credential gives the command
BLOB = "https://teamdata.blob.core.windows.net"


def _job(job_id: str) -> dict:
    """One job's outputs as the stack exports them (infra.azureml_job.AZUREML_JOB_OUTPUTS)."""
    return {
        "job_id": job_id,
        "job_state": "NotStarted",
        "job_studio_url": f"https://ml.azure.com/runs/{job_id}?wsid={WORKSPACE}",
        "job_log_url": f"{BLOB}/logs/{job_id}/",
        "metrics_url": f"{BLOB}/logs/{job_id}/live/",
        "outputs_url": f"{BLOB}/outputs/{job_id}/",
        "checkpoint_mirror_url": f"{BLOB}/checkpoints/dev/0123456789ab/",
        "node_count": 2,
    }


@pytest.fixture
def aml(tmp_path, monkeypatch):
    jobs = FakeAzuremlJobs(tmp_path / "nodes", writers={TOKEN})
    with serving_arm(tmp_path, monkeypatch, jobs.handle) as base:
        monkeypatch.setattr(registry_module, "ARM_ENDPOINT", base)
        outputs = {
            "azureml_compute_name": "platform-dev-amlc",
            "azureml_workspace_id": WORKSPACE,
            "azureml_studio_url": f"https://ml.azure.com/?wsid={WORKSPACE}",
            "image_ref": "acr.io/trainer:1",
            "jobs": {"train": _job("dev-train-1"), "eval": _job("dev-eval-2")},
        }
        (tmp_path / "outputs.json").write_text(json.dumps(outputs))
        yield jobs


def _start(jobs: FakeAzuremlJobs, name: str, command: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    body = {"properties": {"jobType": "Command", "command": command}}
    assert jobs.handle("PUT", f"{WORKSPACE}/jobs/{name}", {}, auth, body)[0] == 201


def _run(capsys, tmp_path, *argv: str) -> tuple[int, str, str]:
    files = ["--stack", "dev", "--outputs-file", str(tmp_path / "outputs.json")]
    try:
        code = main([argv[0], *files, *argv[1:]])
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_and_status_show_each_jobs_live_state(aml, capsys, tmp_path):
    _start(aml, "dev-train-1", "sleep 120")
    aml.wait("dev-train-1", states=("Running",))
    code, out, _ = _run(capsys, tmp_path, "list")
    assert code == 0
    assert re.search(r"^train +dev-train-1 +Running +2 +https://ml\.azure\.com/runs/", out, re.M)
    assert re.search(r"^eval +dev-eval-2 +not found +2 ", out, re.M), out
    code, out, _ = _run(capsys, tmp_path, "status", "--job", "train")
    assert code == 0
    assert out.startswith("job         dev-train-1: Running (AzureML)\n")
    assert "dt-jobs cancel --stack dev --job train" in out
    assert f"checkpoints {BLOB}/checkpoints/dev/0123456789ab/" in out
    assert "studio      https://ml.azure.com/runs/dev-train-1?wsid=" in out
    _run(capsys, tmp_path, "cancel", "--job", "train")
    assert aml.wait("dev-train-1") == "Canceled"


def test_cancel_stops_a_running_job_and_keeps_its_checkpoints(aml, capsys, tmp_path):
    _start(aml, "dev-train-1", "sleep 120")
    aml.wait("dev-train-1", states=("Running",))
    code, out, _ = _run(capsys, tmp_path, "cancel", "--job", "train")
    assert code == 0
    assert out.startswith("job dev-train-1: cancel requested (it was Running)")
    assert f"{BLOB}/checkpoints/dev/0123456789ab/" in out
    assert aml.wait("dev-train-1") == "Canceled"
    code, out, _ = _run(capsys, tmp_path, "cancel", "--job", "train")
    assert (code, out) == (0, "job dev-train-1 had already ended (Canceled); nothing to cancel\n")


def test_an_operator_without_a_role_on_the_workspace_gets_one_line_exit_1(aml, capsys, tmp_path):
    aml.writers = set()
    code, out, err = _run(capsys, tmp_path, "status", "--job", "train")
    assert code == 1 and out == ""
    assert err.startswith("error: could not read AzureML job dev-train-1 (403: ")
    assert "this credential needs a role on the workspace" in err and err.count("\n") == 1


def test_keep_out_which_is_batchs_says_where_to_look_instead(aml, capsys, tmp_path):
    code, out, err = _run(capsys, tmp_path, "keep-out", "--job", "train", "tvm-1")
    assert code == 2 and out == ""
    assert err.startswith("error: stack=dev: dt-jobs keep-out ")
    assert "AzureML replaces a compute cluster's failed node itself" in err
    assert err.count("\n") == 1
    code, out, err = _run(capsys, tmp_path, "logs", "--job", "train", "--stderr")
    assert (code, out) == (2, "") and err.startswith("error: --stderr: an AzureML job's node")
