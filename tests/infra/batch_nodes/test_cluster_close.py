"""The emulator's own clean-up: the node namespaces are the session's, so a closed cluster must
leave them empty (make_cluster checks it after every test) and start nothing afterwards."""

from __future__ import annotations

import time

import pytest

from tests.batch_emulator.jobs import (
    TINY,
    booted,
    make_spec,
    submit,
    wait_for,
)
from tests.batch_emulator.processes import ClusterClosed
from tests.batch_emulator.vm_events import REJOIN_SECONDS

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes


def test_close_ends_a_run_still_going_and_a_rejoining_node_starts_nothing(
    make_cluster, vnet, storage, cpu_stack
):
    cluster = booted(make_cluster, cpu_stack, nodes=3, lifecycle="kill")
    run = submit(cluster, make_spec(cpu_stack, storage, trainer={**TINY, "epochs": 4000}))
    wait_for(lambda: len(run.running) == 2, 60, "the coordination commands", cluster, run)
    idle = next(n for n in cluster.nodes if n not in run.nodes)
    cluster._take(idle, "Reboot")  # it would run its start task again REJOIN_SECONDS later
    assert vnet.node_processes()

    cluster.close()  # as a test that failed half-way leaves it: the run still training
    assert run.finished.is_set() and not run.is_alive()
    time.sleep(REJOIN_SECONDS + 0.5)
    assert vnet.node_processes() == []
    with pytest.raises(ClusterClosed, match="the cluster is closed"):
        cluster.hold_batch_port(cluster.nodes[0])
    assert vnet.node_processes() == []
