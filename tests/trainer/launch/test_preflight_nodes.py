"""The launcher's preflight on simulated Batch nodes, for a job's own command (the trainer's jobs
run the same code: test_launch.py). The nodes live in network namespaces of their own
(tests/batch_emulator/vnet.py), so one node's network can be slowed with ``tc``: a fault a
test sets, the code under test unchanged. CPU nodes have no size floor: a figure below half the
median of the other nodes' (or pairs') is slow."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.batch_emulator.vnet import VNet
from tests.trainer.launch.launch_nodes import report, start_nodes
from trainer.launch.preflight_probe import RESULT

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


@pytest.fixture
def fabric(request) -> Iterator[VNet]:
    nodes = request.param
    if shutil.which("tc") is None:
        pytest.skip("tc (iproute2) is not installed: cannot slow a node's network")
    fabric = VNet(nodes, "10.77.0.0/24")
    try:
        if not fabric.isolated:
            pytest.skip("network namespaces are unavailable (root and ip netns needed)")
        yield fabric
    finally:
        fabric.close()


def _slow(fabric: VNet, index: int, device: str) -> None:
    """Node ``index``'s ``device`` sends at 80 Mbit/s (a port that trained down, a bad cable):
    a token bucket filter (``netem`` is a module not every kernel has)."""
    ns = fabric.node_ns(index)
    command = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", device, "root", "tbf"]
    rate = ["rate", "80mbit", "burst", "128kb", "latency", "400ms"]  # burst > lo's MTU
    subprocess.run([*command, *rate], check=True, capture_output=True)


def _launch(tmp_path, fabric: VNet, *launch_args: str) -> tuple[list[str], str]:
    """Every node's launcher on a job's own command (torch engine) with the preflight on; (each
    node's log, the primary's report) once they ended. The worker leaves a mark if it ran."""
    worker = [sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'a').write('ran')"]
    hosts = tuple(fabric.node_ips)
    nodes = start_nodes(
        tmp_path,
        worker,
        "--preflight",
        "on",
        "--defer-exit-code",
        *launch_args,
        run_dir=tmp_path / "run",
        backend="torch",
        hosts=hosts,
        node_env=tuple({"AZ_BATCH_NODE_ID": f"tvm-{i + 1}"} for i in range(len(hosts))),
        prefix=lambda index: fabric.exec_prefix(fabric.node_ns(index)),
    )
    try:
        codes = [node.wait(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    logs = [(tmp_path / f"node{i}.log").read_text() for i in range(len(hosts))]
    assert codes == [0] * len(hosts), "\n".join(logs)  # recorded; the report decides
    reported = report(tmp_path / "run", worker, hosts)
    assert reported.returncode == 1, reported.stdout + reported.stderr
    return logs, reported.stdout


@pytest.mark.parametrize("fabric", [3], indirect=True)
def test_a_node_whose_network_is_slow_is_named_with_its_keep_out_line_and_no_worker_starts(
    tmp_path, fabric
):
    _slow(fabric, 2, "eth0")
    logs, reported = _launch(tmp_path, fabric)
    slow = f"node {fabric.node_ips[2]} (tvm-3)"
    for log in logs:  # every node reached the same verdict
        assert f"preflight: {slow} is slow; keep it out of the job's next tries: " in log
        assert "dt-jobs keep-out --stack NAME tvm-3" in log
        assert "BELOW the floor" in log and "half the other pairs' median" in log
        assert "tvm-1 is slow" not in log and "tvm-2 is slow" not in log
    assert not (tmp_path / "ran").exists()  # the job's command never started
    last = reported.splitlines()[-1]
    assert f"failed: preflight: slow {slow}: dt-jobs keep-out --stack NAME tvm-3" in last


@pytest.mark.parametrize("fabric", [2], indirect=True)
def test_a_node_whose_own_workers_are_slow_together_is_named(tmp_path, fabric):
    """Two workers per node: node 2's talk to each other over its loopback, which is slowed (on
    GPUs: its NVLink, held to the size's floor)."""
    _slow(fabric, 1, "lo")
    logs, reported = _launch(tmp_path, fabric, "--workers-per-node", "2")
    slow = f"node {fabric.node_ips[1]} (tvm-2)"
    for log in logs:
        assert f"preflight: {slow}: 2 workers, allreduce" in log
        assert "half the other nodes' median" in log
        assert f"preflight: {slow} is slow" in log and "dt-jobs keep-out --stack NAME tvm-2" in log
        # One pair of nodes: nothing to compare it with, so it names no link.
        assert "not judged" in log and "link between" not in log
    assert not (tmp_path / "ran").exists()
    assert "dt-jobs keep-out --stack NAME tvm-2" in reported.splitlines()[-1]


def test_the_gpu_path_times_a_nodes_gpus_together_with_nccl():
    """The probes as a GPU node runs them (NCCL, one per GPU), within one node."""
    from tests.support.ports import free_port
    from tests.trainer.engines.test_gpu import require_gpu
    from trainer.launch.preflight import ITERATIONS
    from trainer.launch.preflight_plan import rounds

    require_gpu()
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 2:
        pytest.skip(f"{gpus} GPU: nothing within a node to time")
    port, plan = free_port(), rounds(1, gpus)
    spec = {"master": "127.0.0.1", "port": port, "nodes": 1, "world": gpus, "slots": gpus,
            "position": 0, "host": "127.0.0.1", "node_id": "", "device": "cuda",
            "megabytes": 64, "iterations": ITERATIONS, "timeout": 120,
            "rounds": [[list(g.ranks) for g in groups] for groups in plan]}  # fmt: skip
    command = [sys.executable, "-m", "trainer.launch.preflight_probe"]
    probes = [
        subprocess.Popen(
            [*command, json.dumps({**spec, "rank": local, "local": local})],
            stdout=subprocess.PIPE,
            text=True,
        )
        for local in range(gpus)
    ]
    outputs = [probe.communicate(timeout=180)[0] for probe in probes]
    assert [probe.returncode for probe in probes] == [0] * gpus, outputs
    (line,) = [line for line in outputs[0].splitlines() if line.startswith(RESULT)]
    result = json.loads(line[len(RESULT) :])
    assert result["names"] == [["127.0.0.1", ""]] and result["seconds"]["0"] > 0
