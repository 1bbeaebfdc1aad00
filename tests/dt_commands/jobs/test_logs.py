"""``dt-jobs logs`` with the real SDK against the fake Batch server, under each reading of where
the primary's coordination output goes (``COORDINATION_OUTPUTS``): every node's output, the
primary's coordination command's included, is followed while the task runs."""

from __future__ import annotations

import io

import pytest
from azure.batch import BatchClient
from azure.core.credentials import AccessToken

from dt_commands.jobs import logs as logs_command
from dt_commands.jobs.logs import logs
from tests.support.fake_batch import COORDINATION_OUTPUTS, FakeBatch

JOB = "dev-892e482eaf"
OUTPUTS = {"job_id": JOB}


class _Token:
    def get_token(self, *scopes, **kwargs):
        return AccessToken("operator-token", 4102444800)


@pytest.fixture(params=COORDINATION_OUTPUTS)
def batch(request, tmp_path):
    fake = FakeBatch(tmp_path / "tls", coordination_output=request.param)
    fake.add_job(JOB, "active")
    settings = {"numberOfInstances": 2, "coordinationCommandLine": "launch"}
    fake.tasks[JOB] = [{"id": "train", "multiInstanceSettings": settings}]
    fake.task_state = "active"
    yield fake
    fake.close()


def _client(fake: FakeBatch) -> BatchClient:
    return BatchClient(fake.url, _Token(), connection_verify=str(fake.ca_path))


def _follow(batch: FakeBatch, monkeypatch, steps, **options) -> list[str]:
    """``logs`` run to the task's end, ``steps`` happening one per poll."""
    timeline = iter(steps)
    monkeypatch.setattr(logs_command.time, "sleep", lambda seconds: next(timeline)())
    out = io.StringIO()
    assert logs(_client(batch), OUTPUTS, out, poll_seconds=0, **options) == 0
    return out.getvalue().splitlines()


def test_logs_follow_the_primarys_coordination_output_as_it_grows(batch, monkeypatch):
    """The launchers train in the coordination command (infra/batch.py), so the primary's
    training lines come from it, before the application command (the report) starts: they
    must show as they come, whichever file Batch puts them in."""

    def coordination(instance: int, data: bytes):
        return batch.write(JOB, "train", instance, data, command="coordination")

    steps = [
        lambda: (
            batch.place_task(JOB, "train", ["tvm-0", "tvm-1"]),
            setattr(batch, "task_state", "running"),
            coordination(0, b"node 1/2: starting 1 worker(s)\n"),
            coordination(1, b"node 2/2: starting 1 worker(s)\n"),
        ),
        lambda: coordination(0, b"step 1 loss 2.0\n"),
        lambda: batch.write(JOB, "train", 0, b"report: every node trained\n"),
        lambda: setattr(batch, "task_state", "completed"),
    ]
    lines = _follow(batch, monkeypatch, steps)
    assert lines == [
        "waiting for task train to start (state: active)",
        "[tvm-0] node 1/2: starting 1 worker(s)",
        "[tvm-1] node 2/2: starting 1 worker(s)",
        "[tvm-0] step 1 loss 2.0",
        "[tvm-0] report: every node trained",
    ]


def test_logs_follow_the_primarys_coordination_stderr(batch, monkeypatch):
    steps = [
        lambda: (
            batch.place_task(JOB, "train", ["tvm-0", "tvm-1"]),
            setattr(batch, "task_state", "running"),
            batch.write(JOB, "train", 0, b"warning: slow disk\n", "stderr.txt", "coordination"),
            batch.write(JOB, "train", 0, b"not this stream\n", "stdout.txt", "coordination"),
        ),
        lambda: setattr(batch, "task_state", "completed"),
    ]
    lines = _follow(batch, monkeypatch, steps, file_name="stderr.txt")
    assert lines[1:] == ["[tvm-0] warning: slow disk"]
