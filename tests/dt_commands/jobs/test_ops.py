"""``dt-jobs`` against an autospec of the real BatchClient, and ``cancel``
with the real SDK against a fake Batch server (the SDK's own request building is what broke it)."""

import io
import json
import os
import stat
import time
from unittest.mock import create_autospec

import pytest
from azure.batch import BatchClient
from azure.batch import models as m
from azure.core.credentials import AccessToken

from dt_commands.jobs import logs as logs_command
from dt_commands.jobs.cancel import cancel
from dt_commands.jobs.logs import logs
from dt_commands.jobs.main import main
from dt_commands.jobs.status import status
from dt_commands.stack_outputs import JobsError, read_outputs
from tests.support.fake_batch import FakeBatch
from trainer.launch.records import KEEP_OUT_HINT

OUTPUTS = {
    "job_id": "dev-892e482eaf",
    "batch_account_endpoint": "platformbatch.eastus.batch.azure.com",
    "job_log_url": "https://platformdata.blob.core.windows.net/logs/dev-892e482eaf/",
    "job_checkpoint_path": "shared/runs/dev/7335cd45683b",
}


@pytest.fixture
def client():
    return create_autospec(BatchClient, instance=True)


def test_status_shows_job_task_retries_and_locations(client):
    client.get_job.return_value = m.BatchJob(state="active")
    client.get_task.return_value = m.BatchTask(
        state="running", execution_info=m.BatchTaskExecutionInfo(retry_count=1, requeue_count=0)
    )
    out = io.StringIO()
    assert status(client, OUTPUTS, out) == 0
    text = out.getvalue()
    assert "job         dev-892e482eaf: active" in text
    assert "task        train: running" in text and "retries 1, exit code -" in text
    assert "checkpoints shared/runs/dev/7335cd45683b" in text
    client.get_task.assert_called_once_with("dev-892e482eaf", "train")


def test_status_names_the_stragglers_the_last_refresh_read(client):
    client.get_job.return_value = m.BatchJob(state="active")
    client.get_task.return_value = m.BatchTask(state="running")
    line = "rank 1 on node-1: data_wait_sec 0.200s per step against 0.010s on the other ranks"
    outputs = {**OUTPUTS, "stragglers": [line], "progress_at": "2026-11-26T10:00:00+00:00"}
    out = io.StringIO()
    assert status(client, outputs, out) == 0
    assert f"straggler   {line} (as of 2026-11-26T10:00:00+00:00)" in out.getvalue().splitlines()


class StaticToken:
    def get_token(self, *scopes, **kwargs):
        return AccessToken("fake-token", int(time.time()) + 3600)


OPERATOR_TOKEN = "fake-token"  # StaticToken's
OWNER_TOKEN = "owner-token"


class OwnerToken:
    """The stack's deployer: Owner on the subscription, and the stack's Job Submitter grant
    (docs/deploy.md, Who may do what)."""

    def get_token(self, *scopes, **kwargs):
        return AccessToken(OWNER_TOKEN, int(time.time()) + 3600)


@pytest.fixture
def batch(tmp_path):
    # The operator running dt-jobs is one of the team: the team's group holds Job Submitter.
    # The deployer holds Owner and the Job Submitter the stack grants it.
    submitter = "Azure Batch Job Submitter"
    roles = {OPERATOR_TOKEN: (submitter,), OWNER_TOKEN: ("Owner", submitter)}
    fake = FakeBatch(tmp_path / "tls", roles=roles)
    yield fake
    fake.close()


def _real_client(fake):
    # The real SDK; only the endpoint, the token and the trusted certificate are the test's.
    return BatchClient(fake.url, StaticToken(), connection_verify=str(fake.ca_path))


def test_cancel_terminates_with_the_real_sdk_and_says_where_checkpoints_are(batch):
    batch.add_job("dev-892e482eaf", "active")
    out = io.StringIO()
    assert cancel(_real_client(batch), OUTPUTS, out) == 0
    terminate = [r for r in batch.requests if r.path == "/jobs/dev-892e482eaf/terminate"]
    assert len(terminate) == 1 and terminate[0].body == {"terminateReason": "UserTerminate"}
    assert batch.jobs["dev-892e482eaf"]["state"] == "completed"
    assert "checkpoints stay in shared/runs/dev/7335cd45683b" in out.getvalue()


def test_the_bare_sdk_call_fails_before_sending_which_is_why_cancel_passes_options(batch):
    batch.add_job("dev-892e482eaf", "active")
    # azure-batch 15.1.0: no options -> no Content-Type -> ValueError while building the request
    # (as in Azure/azure-sdk-for-python #46815). If this starts passing, the workaround can go.
    with pytest.raises(ValueError, match="No value for given attribute"):
        _real_client(batch).begin_terminate_job("dev-892e482eaf")
    assert not batch.requests


def test_cancel_surfaces_a_failed_poll_as_a_one_line_error(batch, tmp_path, capsys):
    batch.add_job("dev-892e482eaf", "active")
    batch.state_after_terminate = "terminating"

    def poll_fails(request, fake):
        if request.method == "GET" and any(r.path.endswith("/terminate") for r in fake.requests):
            return 403, "AuthorizationFailure"
        return None

    batch.faults.append(poll_fails)
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(OUTPUTS))
    argv = ["cancel", "--stack", "dev", "--outputs-file", str(outputs)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv, lambda endpoint: _real_client(batch))
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "job dev-892e482eaf: (AuthorizationFailure)" in err


def test_outputs_come_from_the_pulumi_cli(tmp_path, monkeypatch):
    fake = tmp_path / "pulumi"
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(OUTPUTS)}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert read_outputs("dev", None)["job_id"] == "dev-892e482eaf"


def test_missing_outputs_and_cli_are_one_line_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JobsError, match="pulumi CLI is not on PATH"):
        read_outputs("dev", None)
    no_job = tmp_path / "outputs.json"
    no_job.write_text(json.dumps({"batch_account_endpoint": "x"}))
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "--stack", "dev", "--outputs-file", str(no_job)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"outputs_file={no_job}: has no job_id output" in err


def test_main_wires_the_stack_outputs_to_the_client(tmp_path, client, capsys):
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(OUTPUTS))
    endpoints = []

    def factory(endpoint):
        endpoints.append(endpoint)
        return client

    assert main(["cancel", "--stack", "dev", "--outputs-file", str(outputs)], factory) == 0
    assert endpoints == ["platformbatch.eastus.batch.azure.com"]
    assert "terminated" in capsys.readouterr().out


# ---------------------------------------------------------------------- logs
JOB = OUTPUTS["job_id"]


def _multi_instance(batch, nodes=2):
    batch.add_job(JOB, "active")
    settings = {"numberOfInstances": nodes, "coordinationCommandLine": "launch"}
    batch.tasks[JOB] = [{"id": "train", "multiInstanceSettings": settings}]
    batch.task_state = "active"


def _ranges(batch):
    """(path, ocp-range) of every file read (GET) the fake saw."""
    return [
        (r.path, r.headers.get("ocp-range"))
        for r in batch.requests
        if r.method == "GET" and "/files/" in r.path
    ]


def test_logs_follow_every_node_of_a_running_task_by_byte_range(batch, monkeypatch):
    """The task runs on two nodes; their stdout grows while it runs. `logs` shows each node's
    new lines as they come (by byte range, only new bytes), waits out the files that are not
    readable before the task is scheduled, and stops once the task has completed."""
    _multi_instance(batch)
    timeline = iter(
        [
            lambda: (
                batch.place_task(JOB, "train", ["tvm-0", "tvm-1"]),
                setattr(batch, "task_state", "running"),
                batch.write(JOB, "train", 0, b"node 1/2: starting 1 worker(s)\n"),
                batch.write(JOB, "train", 1, b"node 2/2: starting 1 worker(s)\nstep 1 lo"),
            ),
            lambda: batch.write(JOB, "train", 1, b"ss 2.0\n"),
            lambda: (
                batch.write(JOB, "train", 0, b"node 1/2: done\n"),
                setattr(batch, "task_state", "completed"),
            ),
        ]
    )
    monkeypatch.setattr(logs_command.time, "sleep", lambda seconds: next(timeline)())
    out = io.StringIO()
    assert logs(_real_client(batch), OUTPUTS, out, poll_seconds=0) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "waiting for task train to start (state: active)"
    assert lines[1:] == [
        "[tvm-0] node 1/2: starting 1 worker(s)",
        "[tvm-1] node 2/2: starting 1 worker(s)",
        "[tvm-1] step 1 loss 2.0",
        "[tvm-0] node 1/2: done",
    ]
    primary = f"/jobs/{JOB}/tasks/train/files/stdout.txt"
    subtask = "/pools/ib-gpu/nodes/tvm-1/files/" + "%2F".join(
        [*batch.task_root(JOB, "train", 1).split("/"), "stdout.txt"]
    )
    assert _ranges(batch) == [
        (primary, "bytes=0-30"),
        (subtask, "bytes=0-39"),
        (subtask, "bytes=40-46"),
        (primary, "bytes=31-45"),
    ]


def test_logs_without_follow_print_what_is_there_and_return(batch, monkeypatch):
    _multi_instance(batch)
    batch.place_task(JOB, "train", ["tvm-0", "tvm-1"])
    batch.task_state = "running"
    batch.write(JOB, "train", 0, b"ready\n", name="stderr.txt")
    monkeypatch.setattr(logs_command.time, "sleep", lambda seconds: pytest.fail("must not wait"))
    out = io.StringIO()
    client = _real_client(batch)
    assert logs(client, OUTPUTS, out, file_name="stderr.txt", follow=False) == 0
    assert out.getvalue() == "[tvm-0] ready\n"


def test_a_single_node_task_prints_its_lines_as_they_are(batch, monkeypatch):
    _multi_instance(batch, nodes=1)
    batch.place_task(JOB, "train", ["tvm-0"])
    batch.task_state = "completed"
    batch.write(JOB, "train", 0, b"hello\nno newline at the end")
    monkeypatch.setattr(logs_command.time, "sleep", lambda seconds: pytest.fail("must not wait"))
    out = io.StringIO()
    assert logs(_real_client(batch), OUTPUTS, out) == 0
    assert out.getvalue() == "hello\nno newline at the end\n"


def test_the_fake_reads_byte_ranges_as_batch_does(batch):
    """The fake's file API: 200 with the bytes asked for (a last byte past the end reads to
    the end), 416 InvalidRange from the end on, 404 for a file not written, 409 before the
    task has a node."""
    from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

    _multi_instance(batch)
    client = _real_client(batch)
    with pytest.raises(HttpResponseError) as refused:
        client.get_task_file_properties(JOB, "train", "stdout.txt")
    assert refused.value.status_code == 409
    batch.place_task(JOB, "train", ["tvm-0", "tvm-1"])
    batch.write(JOB, "train", 0, b"0123456789")
    read = b"".join(client.download_task_file(JOB, "train", "stdout.txt", ocp_range="bytes=2-4"))
    assert read == b"234"
    read = b"".join(client.download_task_file(JOB, "train", "stdout.txt", ocp_range="bytes=8-99"))
    assert read == b"89"
    with pytest.raises(HttpResponseError) as past_end:
        list(client.download_task_file(JOB, "train", "stdout.txt", ocp_range="bytes=10-12"))
    assert past_end.value.status_code == 416
    with pytest.raises(ResourceNotFoundError):
        client.get_task_file_properties(JOB, "train", "missing.txt")
    assert client.get_task_file_properties(JOB, "train", "stdout.txt").content_length == 10


# ---------------------------------------------------------------------- pool errors
QUOTA_MESSAGE = (
    "The specified account has reached VM series core quota for standardNDASv4_A100Family"
)


def pool_in_trouble(batch, pool_id="ib-gpu"):
    """A pool as Batch shows it when a job waits in vain: a resize that hit the account's
    family quota (resizeErrors, "Check for pool and node errors"), and the one node it got
    failed its start task (state starttaskfailed, startTaskInfo.failureInfo)."""
    batch.pools[pool_id] = {
        "id": pool_id,
        "allocationState": "steady",
        "enableAutoScale": True,
        "currentDedicatedNodes": 1,
        "targetDedicatedNodes": 2,
        "resizeErrors": [{"code": "AccountVMSeriesCoreQuotaReached", "message": QUOTA_MESSAGE}],
    }
    batch.node_files["tvm-0"] = {
        "startup/stderr.txt": bytearray(f"nvidia-smi: warming up\n{GPU_FAULT}\n\n".encode())
    }
    batch.pool_nodes[pool_id] = [
        {
            "id": "tvm-0",
            "state": "starttaskfailed",
            "schedulingState": "enabled",
            "startTaskInfo": {
                "state": "completed",
                "exitCode": 1,
                "result": "failure",
                "retryCount": 0,
                "failureInfo": {
                    "category": "usererror",
                    "code": "FailureExitCode",
                    "message": "The task process exited with an unexpected exit code",
                },
            },
        }
    ]


GPU_FAULT = "start task: GPU 3: 2 uncorrectable ECC errors since boot; this node's GPU memory"


def _waiting_job(batch) -> None:
    """The job's task waiting for nodes of pool ib-gpu."""
    batch.add_job(JOB, "active")
    batch.jobs[JOB]["poolInfo"] = {"poolId": "ib-gpu"}
    batch.tasks[JOB] = [{"id": "train"}]
    batch.task_state = "active"


def _status_pool_lines(batch, tmp_path, capsys) -> list[str]:
    """What `dt-jobs status` says of the pool."""
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(OUTPUTS))
    argv = ["status", "--stack", "dev", "--outputs-file", str(outputs)]
    assert main(argv, lambda endpoint: _real_client(batch)) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("pool ")]


def test_status_says_why_the_pool_gives_the_job_no_nodes(batch, tmp_path, capsys):
    _waiting_job(batch)
    pool_in_trouble(batch)
    pool = _status_pool_lines(batch, tmp_path, capsys)
    assert len(pool) == 2, pool
    assert "resize error AccountVMSeriesCoreQuotaReached (" + QUOTA_MESSAGE in pool[0]
    assert "request more for the Batch account, not the subscription" in pool[0]
    assert "1 of 1 node(s) failed their start task (tvm-0: The task process exited" in pool[1]
    # The start task's own last line on stderr (read through the Batch file API) says which
    # check failed (infra.node_checks.node_check_command).
    assert f"tvm-0's start task said: {GPU_FAULT})" in pool[1], pool[1]
    assert "cancel the job (dt-jobs cancel --stack dev --job default)" in pool[1]


# A node whose prefetch of the pool's image failed: "the computeNodeError property reports the
# failure, and sets the node state to unusable" (articles/batch/batch-pool-node-error-checking.md,
# read 2026-11-29). Batch documents no code for it; the line quotes whatever code it gives.
PULL_ERROR = {
    "code": "ContainerImageDownloadFailed",
    "message": "Error response from daemon: pull access denied for trainer, repository does not "
    "exist or may require 'docker login'",
}


def test_status_names_nodes_left_unusable_by_a_failed_image_prefetch(batch, tmp_path, capsys):
    _waiting_job(batch)
    batch.pools["ib-gpu"] = {"id": "ib-gpu", "allocationState": "steady"}
    batch.pool_nodes["ib-gpu"] = [
        {"id": "tvm-0", "state": "unusable", "schedulingState": "enabled", "errors": [PULL_ERROR]},
        {"id": "tvm-1", "state": "idle", "schedulingState": "enabled"},
    ]
    pool = _status_pool_lines(batch, tmp_path, capsys)
    assert len(pool) == 1, pool
    (line,) = pool
    assert "1 of 2 node(s) are unusable (tvm-0: ContainerImageDownloadFailed: Error resp" in line
    assert "Batch does not recover them" in line and "AcrPull" in line
    assert "cancel the job (dt-jobs cancel --stack dev --job default)" in line


def _keep_out_setup(batch, tmp_path) -> list[str]:
    batch.add_job(JOB, "active")
    batch.jobs[JOB]["poolInfo"] = {"poolId": "ib-gpu"}
    batch.pools["ib-gpu"] = {"id": "ib-gpu", "allocationState": "steady"}
    batch.pool_nodes["ib-gpu"] = [
        {"id": node, "state": "idle", "schedulingState": "enabled"}
        for node in ("tvm-0", "tvm-1", REAL_NODE_ID)
    ]
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(OUTPUTS))
    return ["keep-out", "--stack", "dev", "--outputs-file", str(outputs)]


# A node id as Batch names them (72 characters).
REAL_NODE_ID = "tvmps_" + "3f" * 32 + "_d"


def test_keep_out_disables_scheduling_on_the_named_nodes_and_undo_enables_it(
    batch, tmp_path, capsys
):
    """The nodes a failed try names are kept out of the next tries with the credential of one
    who may write to the pool, the deployer (docs/jobs.md: the nodes get no right over their
    pool); running tasks finish."""
    base = _keep_out_setup(batch, tmp_path)
    client = lambda endpoint: BatchClient(  # noqa: E731
        batch.url, OwnerToken(), connection_verify=str(batch.ca_path)
    )
    assert main([*base, "tvm-1"], client) == 0
    nodes = {n["id"]: n for n in batch.pool_nodes["ib-gpu"]}
    assert nodes["tvm-1"]["schedulingState"] == "disabled"
    assert nodes["tvm-1"]["disabledWith"] == "taskcompletion"
    assert main([*base, REAL_NODE_ID], client) == 0
    assert nodes[REAL_NODE_ID]["schedulingState"] == "disabled"
    assert nodes["tvm-0"]["schedulingState"] == "enabled"
    out = capsys.readouterr().out
    assert "node tvm-1 takes no new task (the job's next tries go elsewhere)" in out
    # Again: Batch refuses to disable a disabled node; the command says so instead.
    assert main([*base, "tvm-1"], client) == 0
    assert "node tvm-1 already is kept out" in capsys.readouterr().out
    assert main([*base, "--undo", "tvm-1"], client) == 0
    assert nodes["tvm-1"]["schedulingState"] == "enabled"
    assert "node tvm-1 takes tasks again" in capsys.readouterr().out
    # A node the pool does not have, beside one it has: one line naming the node, exit 2,
    # and neither is changed.
    with pytest.raises(SystemExit) as stopped:
        main([*base, "tvm-0", "tvm-9"], client)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "error: NODE='tvm-9': pool ib-gpu has no such node; give the ids `dt-jobs status` names\n"
    )
    assert nodes["tvm-0"]["schedulingState"] == "enabled"


@pytest.mark.parametrize("node", ["", "..", "tvm-0/../..", "a b"])
def test_keep_out_refuses_what_is_not_a_node_id_before_asking_batch(batch, tmp_path, capsys, node):
    base = _keep_out_setup(batch, tmp_path)
    before = len(batch.requests)
    with pytest.raises(SystemExit) as stopped:
        main([*base, node], lambda endpoint: _real_client(batch))
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        f"error: NODE={node!r}: not a Batch node id; give the ids `dt-jobs status` names\n"
    )
    assert len(batch.requests) == before


def test_keep_out_by_a_team_member_names_the_missing_right_and_who_holds_it(
    batch, tmp_path, capsys
):
    """The team's Job Submitter role reads the pool but cannot write to it (docs/deploy.md):
    one line naming the right, the role and the fix, exit 1, and nothing changed."""
    base = _keep_out_setup(batch, tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main([*base, "tvm-1"], lambda endpoint: _real_client(batch))
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"error: job {JOB}: Batch refused to change node scheduling on pool ")
    assert "(403 AuthorizationFailure)" in err
    assert "Microsoft.Batch/batchAccounts/pools/write" in err
    assert "Azure Batch Job Submitter" in err and "Owner or Contributor" in err
    assert {n["schedulingState"] for n in batch.pool_nodes["ib-gpu"]} == {"enabled"}


def test_status_shows_the_node_the_last_failed_try_names(batch, tmp_path, capsys):
    """The primary's report (trainer.launch.records) ends a failed try's output with the node
    whose worker failed; status reads it back through the Batch file API with the real SDK."""
    batch.add_job(JOB, "active")
    batch.jobs[JOB]["poolInfo"] = {"poolId": "ib-gpu"}
    batch.tasks[JOB] = [{"id": "train"}]
    batch.task_retries = 1
    batch.place_task(JOB, "train", ["tvm-0", "tvm-1"])
    failed = (
        "attempt 20261127T081000Z-1a2b3c failed: node 10.0.0.5 (tvm-1) worker 0 exited with -9 "
        f"(exit 137); {KEEP_OUT_HINT}"
    )
    report = "===== node 1/2 10.0.0.4: ... =====\n[launch 10.0.0.4] ...\n" + f"===== {failed}\n"
    batch.write(JOB, "train", 0, ("x" * 20000 + "\n" + report).encode())
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(OUTPUTS))
    argv = ["status", "--stack", "dev", "--outputs-file", str(outputs)]
    assert main(argv, lambda endpoint: _real_client(batch)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"last try    {failed}" in lines, lines
    # A try still running (nothing reported yet) adds no line.
    batch.node_files["tvm-0"] = {}
    batch.place_task(JOB, "train", ["tvm-0", "tvm-1"])
    assert main(argv, lambda endpoint: _real_client(batch)) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if "last try" in line]
    # Unless the stack's last refresh read the line before the retry started (last_try output).
    outputs.write_text(json.dumps({**OUTPUTS, "last_try": failed}))
    assert main(argv, lambda endpoint: _real_client(batch)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"last try    {failed} (as of the last refresh)" in lines, lines
