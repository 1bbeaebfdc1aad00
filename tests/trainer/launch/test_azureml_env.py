"""The launcher's place on an AzureML node (trainer.launch.azureml_env): what AzureML's PyTorch
distribution gives its one process per node (how-to-train-distributed-gpu.md, read
2026-11-29), read into the node the launcher starts its workers from, and every variable it
cannot use refused in one line."""

from __future__ import annotations

import pytest

from trainer.launch.azureml_env import read_azureml_environment
from trainer.launch.batch_env import LaunchError

AZUREML = {
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "6105",
    "WORLD_SIZE": "3",
    "NODE_RANK": "2",
    "RANK": "2",
    "LOCAL_RANK": "0",
}


def test_a_node_is_named_by_its_rank_and_the_master_by_its_address():
    node = read_azureml_environment(AZUREML, "127.0.0.3")
    assert node.hosts == ["127.0.0.1", "node-1", "node-2"]
    assert (node.index, node.name, node.master_ip, node.is_master) == (
        2, "node-2", "127.0.0.1", False,
    )  # fmt: skip
    assert node.label == "node-2 (127.0.0.3)" and node.iface == "lo"
    assert node.port == 6105
    assert node.master_first_rank == 2  # torch's rank order: the master's first
    master = read_azureml_environment({**AZUREML, "NODE_RANK": "0", "RANK": "0"}, None)
    assert master.is_master and master.name == master.label == "127.0.0.1"


def test_a_host_name_in_master_addr_is_resolved():
    alone = {"MASTER_ADDR": "localhost", "WORLD_SIZE": "1", "NODE_RANK": "0"}
    node = read_azureml_environment(alone, None)
    assert node.master_ip == "127.0.0.1" and node.hosts == ["127.0.0.1"]
    assert node.port == 6105  # no MASTER_PORT: the launcher's default, as on Batch


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            {"MASTER_ADDR": ""},
            "MASTER_ADDR is not set: run as an AzureML command job with a PyTorch distribution",
        ),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE=two: expected a whole number"),
        ({"NODE_RANK": "3", "RANK": "3"}, "NODE_RANK=3: not a rank of WORLD_SIZE=3 nodes"),
        (
            {"LOCAL_RANK": "1"},
            "RANK=2 LOCAL_RANK=1: AzureML started more than one launcher on this node: give "
            "the job's PyTorch distribution process_count_per_instance: 1",
        ),
        ({"RANK": "5"}, "RANK=5 LOCAL_RANK=0: AzureML started more than one launcher"),
        (
            {"MASTER_ADDR": "no-such-host.invalid"},
            "MASTER_ADDR=no-such-host.invalid: cannot resolve it",
        ),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000: expected a TCP port number 1-65535"),
    ],
)
def test_what_the_launcher_cannot_use_is_refused_in_one_line(change, line):
    with pytest.raises(LaunchError) as caught:
        read_azureml_environment({**AZUREML, **change}, "127.0.0.3")
    assert str(caught.value).startswith(line), str(caught.value)
    assert "\n" not in str(caught.value)
