"""``dt-jobs logs`` following a training job on emulated Batch nodes, under each reading of
where Batch writes the primary's coordination output (``COORDINATION_OUTPUTS``): every node's
launcher (the coordination command, which trains; its own lines go to stderr), the primary's
included, shows while the coordination commands run, not only in the report after them."""

from __future__ import annotations

import pytest

from tests.batch_emulator.jobs import describe
from tests.infra.batch_nodes.shared_runs import RUN_UNDER_COORDINATION_OUTPUT, FinishedRun
from tests.support.fake_batch import COORDINATION_OUTPUTS

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes


# Each reading's job is one of the two-node runs test_training_job.py checks too (conftest.py,
# READINGS), which `dt-jobs logs` followed from its submission to its end.
@pytest.mark.parametrize("reading", COORDINATION_OUTPUTS)
def test_logs_follow_every_nodes_live_output(reading, request):
    finished: FinishedRun = request.getfixturevalue(RUN_UNDER_COORDINATION_OUTPUT[reading])
    cluster, run = finished.cluster, finished.run
    assert cluster.coordination_output == reading
    assert finished.ended_in_time, describe(cluster, run)
    # It polls until it reads the task completed.
    assert finished.follow_ended == [0] and not finished.follow_alive, describe(cluster, run)
    assert (run.state, run.exit_code) == ("completed", 0), describe(cluster, run)
    printed = finished.printed.lines
    text = "\n".join(line for _, line in printed)
    for node in run.nodes:
        said = f"[{node.id}] [launch {node.ip}] node "
        live = [line for started, line in printed if not started and line.startswith(said)]
        assert live, f"node {node.index}'s launcher was not followed while it ran:\n{text}"
