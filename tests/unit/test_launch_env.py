import pytest

from infra.sizes import SUPPORTED
from trainer.fabric import FABRICS, FORBIDDEN_ON_IB, fabric_for, preflight_floor, worker_environment
from trainer.launch import LaunchError, read_batch_environment

BATCH = {
    "AZ_BATCH_HOST_LIST": "127.0.0.1,127.0.0.2",
    "AZ_BATCH_MASTER_NODE": "127.0.0.1:6000",
    "AZ_BATCH_IS_CURRENT_NODE_MASTER": "false",
}


def test_reads_the_node_its_master_and_port():
    node = read_batch_environment(BATCH, "127.0.0.2")
    assert (node.index, node.master_ip, node.port, node.is_master) == (1, "127.0.0.1", 6000, False)
    assert node.iface == "lo"


@pytest.mark.parametrize(
    ("change", "node_ip", "message"),
    [
        ({"AZ_BATCH_HOST_LIST": ""}, "127.0.0.1", "AZ_BATCH_HOST_LIST is not set"),
        ({"AZ_BATCH_MASTER_NODE": "127.0.0.1"}, "127.0.0.1", "expected <ip>:<port>"),
        ({"AZ_BATCH_MASTER_NODE": "10.9.9.9:6000"}, "127.0.0.1", "not in AZ_BATCH_HOST_LIST"),
        ({}, "10.1.1.1", "node_ip=10.1.1.1: not in AZ_BATCH_HOST_LIST"),
        ({}, "127.0.0.1", "AZ_BATCH_IS_CURRENT_NODE_MASTER=false disagrees"),
        (
            {"AZ_BATCH_HOST_LIST": "10.9.9.1,10.9.9.2", "AZ_BATCH_MASTER_NODE": "10.9.9.1:6000"},
            None,
            r"0 match its addresses\): pass --node-ip",
        ),
    ],
)
def test_bad_batch_environments_are_one_line_errors(change, node_ip, message):
    with pytest.raises(LaunchError, match=message):
        read_batch_environment({**BATCH, **change}, node_ip)


def test_every_supported_pool_size_has_fabric_settings():
    assert set(SUPPORTED) <= set(FABRICS)
    for size, fabric in FABRICS.items():
        assert fabric.gpus == SUPPORTED[size].gpus
        assert fabric.env["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"
        assert fabric.env["NCCL_TOPO_FILE"].startswith("/opt/microsoft/nd")
        assert not set(fabric.env) & set(FORBIDDEN_ON_IB)


def test_worker_environment_drops_ib_disable_and_lets_operators_tune():
    inherited = {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth1", "PATH": "/bin"}
    env = worker_environment("Standard_ND96isr_H100_v5", inherited)
    assert "NCCL_IB_DISABLE" not in env
    assert env["NCCL_SOCKET_IFNAME"] == "eth1" and env["PATH"] == "/bin"
    assert env["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv5-topo.xml"
    assert worker_environment(None, inherited) == inherited  # CPU simulation: untouched


def test_preflight_floor_and_unknown_sizes():
    assert preflight_floor("Standard_ND96asr_v4") == 126.0
    with pytest.raises(ValueError, match="vm_size=Standard_NC24rs_v3: not an InfiniBand"):
        fabric_for("Standard_NC24rs_v3")
