"""The local NVMe disks of the dev stack's size (ND H100 v5) on emulated nodes: the start task
assembles them into one array and mounts it, a restart finds the array the kernel assembled
again with what it held, a preemption gives the node blank disks and the start task builds a new
array; a job's preparation stages its dataset there, where its task's container sees it."""

from __future__ import annotations

import dataclasses
import time

import pytest

from infra.batch import NVME_ROOT
from infra.sizes import size_of
from tests.batch_emulator.cluster import Cluster
from tests.batch_emulator.jobs import TINY, booted, describe, make_spec, submit, wait_for
from tests.batch_emulator.node import Node
from tests.batch_emulator.nvme import NvmeDisks

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes


def _disks(node: Node, stack) -> NvmeDisks:
    return NvmeDisks(node.hw, stack.pool.nvme_disks)


def _array(disks: NvmeDisks) -> tuple[str, str]:
    """(device, uuid) of the one array the node's kernel holds."""
    ((device, array),) = disks.arrays().items()
    assert array["members"] == sorted(disks.names)
    return device, array["uuid"]


def _rejoined(cluster: Cluster, node: Node, taken: int) -> None:
    """Wait until the node was taken and ran its start task again."""
    deadline = time.monotonic() + 60
    while node.reboots + node.reimages < taken or node.state != "idle":
        assert node.state != "starttaskfailed", (node.startup_dir / "stderr.txt").read_text()
        assert time.monotonic() < deadline, cluster.events[-20:]
        time.sleep(0.1)


def test_the_array_is_built_once_kept_across_a_restart_and_rebuilt_after_a_preemption(
    make_cluster, gpu_stack
):
    assert gpu_stack.pool.nvme_disks == size_of(gpu_stack.pool.vm_size).nvme_disks == 8
    # One Spot node, so that the platform may preempt it (only Spot nodes are).
    spot = dataclasses.replace(
        gpu_stack, pool=dataclasses.replace(gpu_stack.pool, dedicated_nodes=0, spot_nodes=1)
    )
    cluster = booted(make_cluster, spot, nodes=1)
    node = cluster.nodes[0]
    disks = _disks(node, spot)
    device, first = _array(disks)
    data = disks.mounted(NVME_ROOT)
    assert data is not None and {p.name for p in data.iterdir()} == {"datasets", "code"}
    (data / "datasets" / "kept").write_text("staged before the restart\n")

    cluster.schedule_event("Reboot", [node.vm_name], notice=0.5)
    _rejoined(cluster, node, 1)
    # The kernel assembled the array again under a name of its own; the start task mounted it.
    again, uuid = _array(disks)
    assert (uuid, again != device) == (first, True)
    data = disks.mounted(NVME_ROOT)
    assert data is not None
    assert (data / "datasets" / "kept").read_text() == "staged before the restart\n"

    cluster.schedule_event("Preempt", [node.vm_name], notice=0.5)
    _rejoined(cluster, node, 2)
    _, rebuilt = _array(disks)
    assert rebuilt != first
    data = disks.mounted(NVME_ROOT)
    assert data is not None and not (data / "datasets" / "kept").exists()


def test_a_jobs_preparation_stages_its_dataset_on_the_array(
    make_cluster, storage, gpu_stack, request
):
    prefix = request.getfixturevalue("dataset_prefix")
    cluster = booted(make_cluster, gpu_stack, nodes=1)
    node = cluster.nodes[0]
    spec = make_spec(
        gpu_stack, storage, trainer={**TINY, "max_steps": 2}, dataset_prefix=prefix,
        node_count=1,
    )  # fmt: skip
    run = submit(cluster, spec)
    wait_for(lambda: node.index in run.prep_exit and run.prep_exit[node.index] is not None,
             120, "the job preparation's end", cluster, run)  # fmt: skip
    assert run.prep_exit[node.index] == 0, describe(cluster, run)
    data = _disks(node, gpu_stack).mounted(NVME_ROOT)
    assert data is not None and (data / "datasets" / prefix / "manifest.json").is_file()
    prep_dir = run.prep_dir(node)
    assert prep_dir and not (prep_dir / "wd" / "datasets").exists()  # not on the temp disk
    # Only ends the run: no grace to wait out, while the task's eight workers (one per GPU of
    # the size) would import torch.
    run.terminate("kill")
    run.wait(30)
