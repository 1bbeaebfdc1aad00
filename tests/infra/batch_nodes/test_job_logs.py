"""``dt-jobs logs`` following a training job on emulated Batch nodes, under each reading of
where Batch writes the primary's coordination output (``COORDINATION_OUTPUTS``): every node's
launcher (the coordination command, which trains; its own lines go to stderr), the primary's
included, shows while the coordination commands run, not only in the report after them."""

from __future__ import annotations

import io
import threading

import pytest
from azure.batch import BatchClient
from azure.core.credentials import AccessToken

from dt_commands.jobs.logs import logs
from tests.batch_emulator.batch_api import EmulatedBatchApi
from tests.batch_emulator.job_run import JobRun
from tests.batch_emulator.jobs import RUN_SECONDS, TINY, booted, describe, make_spec, submit
from tests.support.fake_batch import COORDINATION_OUTPUTS

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes


class _Token:
    def get_token(self, *scopes, **kwargs):
        return AccessToken("operator-token", 4102444800)


class _Printed(io.StringIO):
    """What ``logs`` printed, each line with whether the application command had started."""

    def __init__(self, run: JobRun) -> None:
        super().__init__()
        self.run = run
        self.lines: list[tuple[bool, str]] = []

    def write(self, text: str) -> int:
        started = self.run.application is not None
        self.lines += [(started, line) for line in text.splitlines()]
        return super().write(text)


@pytest.mark.parametrize("reading", COORDINATION_OUTPUTS)
def test_logs_follow_every_nodes_live_output(make_cluster, storage, cpu_stack, tmp_path, reading):
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill", coordination_output=reading)
    spec = make_spec(cpu_stack, storage, trainer={**TINY, "max_steps": 8, "epochs": 9})
    run = submit(cluster, spec)
    api = EmulatedBatchApi(tmp_path / "batch-api", cluster, run)
    try:
        client = BatchClient(api.url, _Token(), connection_verify=str(api.ca_path))
        printed = _Printed(run)
        ended: list[int] = []
        options = {"file_name": "stderr.txt", "poll_seconds": 0.2}
        follow = threading.Thread(
            target=lambda: ended.append(logs(client, {"job_id": spec.job_id}, printed, **options))
        )
        follow.start()
        assert run.wait(RUN_SECONDS), describe(cluster, run)
        follow.join(60)  # it polls until it reads the task completed
        assert ended == [0] and not follow.is_alive(), describe(cluster, run)
    finally:
        api.close()
    assert (run.state, run.exit_code) == ("completed", 0), describe(cluster, run)
    text = "\n".join(line for _, line in printed.lines)
    for node in run.nodes:
        said = f"[{node.id}] [launch {node.ip}] node "
        live = [line for started, line in printed.lines if not started and line.startswith(said)]
        assert live, f"node {node.index}'s launcher was not followed while it ran:\n{text}"
