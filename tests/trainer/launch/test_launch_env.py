import io
import json
import os
import subprocess
import sys

import pytest

from infra.sizes import CPU_ACCEPTANCE, SUPPORTED, check_same_sizes
from infra.task_report import REPORT_MARK
from trainer.launch.batch_env import (
    DEFAULT_PORT,
    LaunchError,
    Node,
    read_batch_environment,
    torch_master_port,
)
from trainer.launch.main import main
from trainer.launch.node_sizes import (
    CPU_FABRICS,
    FABRICS,
    FORBIDDEN_ON_IB,
    fabric_for,
    preflight_floor,
    worker_environment,
    workers_per_node,
)
from trainer.launch.options import build_parser
from trainer.launch.records import (
    INTERRUPTED_EXIT,
    KEEP_OUT_HINT,
    Outcome,
    RunRecords,
    check_writable,
)
from trainer.launch.rendezvous import torch_worker_env
from trainer.launch.workers import check_engine, worker_envs

BATCH = {
    "AZ_BATCH_HOST_LIST": "127.0.0.1,127.0.0.2",
    "AZ_BATCH_MASTER_NODE": "127.0.0.1:6000",
    "AZ_BATCH_IS_CURRENT_NODE_MASTER": "false",
}


def test_reads_the_node_and_its_master_but_never_uses_batchs_reserved_port():
    node = read_batch_environment(BATCH, "127.0.0.2")
    assert (node.index, node.master_ip, node.is_master) == (1, "127.0.0.1", False)
    # The port in AZ_BATCH_MASTER_NODE is Batch's own: MASTER_PORT, else 6105.
    assert node.port == DEFAULT_PORT == 6105
    assert node.iface == "lo"
    assert read_batch_environment({**BATCH, "MASTER_PORT": "29500"}, "127.0.0.2").port == 29500
    with_option = read_batch_environment({**BATCH, "MASTER_PORT": "29500"}, "127.0.0.2", 7000)
    assert with_option.port == 7000
    no_port = read_batch_environment({**BATCH, "AZ_BATCH_MASTER_NODE": "127.0.0.1"}, "127.0.0.2")
    assert no_port.master_ip == "127.0.0.1"


@pytest.mark.parametrize(
    ("change", "node_ip", "message"),
    [
        ({"AZ_BATCH_HOST_LIST": ""}, "127.0.0.1", "AZ_BATCH_HOST_LIST is not set"),
        ({"MASTER_PORT": "61o5"}, "127.0.0.2", "MASTER_PORT=61o5: expected a TCP port"),
        ({"MASTER_PORT": "70000"}, "127.0.0.2", "MASTER_PORT=70000: expected a TCP port"),
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
        assert all(path.startswith("/opt/microsoft/nd") for path in fabric.topo_files)
        assert not set(fabric.env) & set(FORBIDDEN_ON_IB)


def test_infra_sizes_refuses_at_import_a_size_the_launcher_table_lacks():
    """One table per size: infra/sizes.py holds the Azure facts of the launcher's sizes only."""
    check_same_sizes("a", {"Standard_X": 1}, "b", {"Standard_X": 2})
    with pytest.raises(RuntimeError) as failure:
        check_same_sizes("a", {"Standard_X": 1, "Standard_Y": 1}, "b", {"Standard_X": 1, "Z": 1})
    assert str(failure.value) == (
        "a and b must name the same VM sizes: Standard_Y only in a; Z only in b; add the size to "
        "both tables or remove it from both"
    )
    script = "import trainer.launch.node_sizes as f; del f.FABRICS['Standard_ND96asr_v4']\n"
    script += "import infra.sizes"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    assert (
        "RuntimeError: infra/sizes.py SUPPORTED and trainer/launch/node_sizes.py FABRICS must name "
        "the same VM sizes: Standard_ND96asr_v4 only in infra/sizes.py SUPPORTED"
    ) in result.stderr


def test_worker_environment_drops_ib_disable_and_lets_operators_tune():
    inherited = {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth1", "PATH": "/bin"}
    env = worker_environment("Standard_ND96isr_H100_v5", inherited)
    assert "NCCL_IB_DISABLE" not in env
    assert env["NCCL_SOCKET_IFNAME"] == "eth1" and env["PATH"] == "/bin"
    assert worker_environment(None, inherited) == inherited  # CPU simulation: untouched


NDV5_TOPO, NDV5_OLD_TOPO = "/opt/microsoft/ndv5/topo.xml", "/opt/microsoft/ndv5-topo.xml"
NDV4_TOPO = "/opt/microsoft/ndv4/topo.xml"


@pytest.mark.parametrize(
    ("size", "present", "expected"),
    [
        # Current HPC images: /opt/microsoft/<family>/topo.xml (Azure/azhpc-images ndv5.sh).
        ("Standard_ND96isr_H100_v5", {NDV5_TOPO, "/opt/microsoft/ndv5-topo.xml"}, NDV5_TOPO),
        # Older images have only the deprecated file.
        ("Standard_ND96isr_H100_v5", {NDV5_OLD_TOPO}, NDV5_OLD_TOPO),
        ("Standard_ND96amsr_A100_v4", {NDV4_TOPO}, NDV4_TOPO),
        # Neither: NCCL detects the topology itself rather than failing on a missing file.
        ("Standard_ND96asr_v4", set(), None),
    ],
)  # fmt: skip
def test_the_topology_file_is_the_first_that_exists_on_the_node(size, present, expected):
    env = worker_environment(size, {}, exists=present.__contains__)
    assert env.get("NCCL_TOPO_FILE") == expected


# What the Azure HPC image writes to the host's /etc/nccl.conf per family, which a container
# never reads (Azure/azhpc-images customizations/ndv4.sh at 4657de67, ndv5.sh at bf3b320e);
# NCCL_TOPO_FILE is left out: the launcher names the first topology file on the node instead.
HPC_IMAGE_NCCL_CONF = {
    "ndv4": {"NCCL_IB_PCI_RELAXED_ORDERING": "1", "NCCL_IGNORE_CPU_AFFINITY": "1"},
    "ndv5": {"NCCL_IB_PCI_RELAXED_ORDERING": "1", "NCCL_IGNORE_CPU_AFFINITY": "1"},
}
FAMILY = {
    "Standard_ND96isr_H100_v5": "ndv5",
    "Standard_ND96isr_H200_v5": "ndv5",
    "Standard_ND96asr_v4": "ndv4",
    "Standard_ND96amsr_A100_v4": "ndv4",
}


@pytest.mark.parametrize("size", sorted(FAMILY))
def test_every_gpu_size_gets_its_hpc_images_nccl_settings_in_the_container(size):
    assert set(FAMILY) == set(FABRICS)  # a new size needs its family's settings here too
    env = worker_environment(size, {})
    assert {key: env.get(key) for key in HPC_IMAGE_NCCL_CONF[FAMILY[size]]} == (
        HPC_IMAGE_NCCL_CONF[FAMILY[size]]
    )


def test_the_cpu_acceptance_size_runs_one_gloo_worker_per_node_with_no_nccl_or_floor():
    assert set(CPU_FABRICS) == set(CPU_ACCEPTANCE)
    size = "Standard_D2ds_v5"
    assert workers_per_node(size) == 1 and workers_per_node("Standard_ND96asr_v4") == 8
    env = worker_environment(size, {"PATH": "/bin"}, exists=lambda path: True)
    assert env == {"PATH": "/bin"}  # no NCCL_*, UCX_* or topology file: Gloo over TCP
    assert preflight_floor(size) == 0.0


def test_preflight_floor_and_unknown_sizes():
    assert preflight_floor("Standard_ND96asr_v4") == 126.0
    with pytest.raises(ValueError, match="vm_size=Standard_NC24rs_v3: not an InfiniBand"):
        fabric_for("Standard_NC24rs_v3")


def test_the_run_folder_is_the_launchers_own_option_never_read_from_the_worker_command(
    monkeypatch, capsys
):
    worker = ["python", "-m", "trainer", "--output-dir", "/r/b"]
    assert build_parser().parse_args(["--run-dir", "/r/a", "--", *worker]).run_dir.as_posix() == (
        "/r/a"
    )
    assert build_parser().parse_args(["--", *worker]).run_dir is None
    # Two nodes need the run folder for the token: the worker's --output-dir does not count.
    for key, value in BATCH.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as stopped:
        main(["--workers-per-node", "1", "--node-ip", "127.0.0.2", "--", *worker])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "the launcher needs --run-dir" in err and err.count("\n") == 1


def test_an_unwritable_output_dir_is_one_line_naming_the_folder_and_the_fix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LaunchError) as failure:
        check_writable(blocker / "runs")
    message = str(failure.value)
    assert message.startswith(f"output_dir={blocker / 'runs'}: cannot create or write it as uid")
    assert "writable for the task's user" in message and "\n" not in message
    check_writable(tmp_path / "runs" / "new")  # created, probe removed
    assert not list((tmp_path / "runs" / "new").iterdir())


def _record(tmp_path, outcomes, hosts=("10.0.0.4", "10.0.0.5"), job="job-1"):
    records = RunRecords(tmp_path)
    attempt = records.new_attempt()
    records.start(attempt, list(hosts), {"AZ_BATCH_JOB_ID": job})
    for host, outcome in zip(hosts, outcomes, strict=False):
        records.log_path(attempt, host).write_text(f"log of {host} in {attempt}\n")
        if outcome is not None:
            records.finish(attempt, host, outcome)
    return records, attempt


ENV = {"AZ_BATCH_HOST_LIST": "10.0.0.4,10.0.0.5", "AZ_BATCH_JOB_ID": "job-1"}


def test_report_prints_every_nodes_log_of_the_current_attempt_only(tmp_path):
    ok = Outcome(0, "every worker finished")
    _record(tmp_path, [Outcome(3, "node 10.0.0.5 worker 1 exited with 3")] * 2)  # an old attempt
    records, attempt = _record(tmp_path, [ok, ok])
    out = io.StringIO()
    assert records.report(ENV, out) == 0
    text = out.getvalue()
    assert f"log of 10.0.0.4 in {attempt}" in text and f"log of 10.0.0.5 in {attempt}" in text
    assert "exited with 3" not in text and text.count("log of") == 2
    assert text.rstrip().endswith(f"attempt {attempt}: every node finished")


@pytest.mark.parametrize(
    ("outcomes", "code", "summary"),
    [
        ([Outcome(0, "ok"), Outcome(3, "worker 1 exited with 3")], 3, "worker 1 exited with 3"),
        ([Outcome(0, "ok"), None], 1, "node 10.0.0.5 recorded no outcome"),
        ([Outcome(0, "ok"), Outcome(0, "signal", True)], INTERRUPTED_EXIT, "stopped by a signal"),
    ],
)
def test_report_exits_with_the_recorded_outcome(tmp_path, outcomes, code, summary):
    records, _ = _record(tmp_path, outcomes)
    out = io.StringIO()
    waits: list[float] = []
    # A missing outcome is looked for again until NFS_CACHE_SECONDS passed: not here.
    assert records.report(ENV, out, wait=0, sleep=waits.append) == code
    assert summary in out.getvalue().splitlines()[-1]
    assert waits == []
    # dt-jobs status finds the try's summary in the primary's output by this mark.
    assert out.getvalue().splitlines()[-1].startswith(REPORT_MARK)
    if code not in (0, INTERRUPTED_EXIT):
        assert out.getvalue().rstrip().endswith(KEEP_OUT_HINT)


def test_a_node_that_kept_itself_out_but_did_not_restart_is_named_once_in_the_summary(tmp_path):
    kept_out = "node 10.0.0.5 (tvm-2) failed its checks and keeps itself out of the pool: GPU 3"
    outcomes = [
        Outcome(1, "node 10.0.0.5 (tvm-2) worker 0 exited with -9"),
        Outcome(1, f"node 10.0.0.5 (tvm-2) worker 0 exited with -9; {kept_out}", kept_out=kept_out),
    ]
    records, _ = _record(tmp_path, outcomes)
    out = io.StringIO()
    assert records.report(ENV, out, wait=0) == 1
    last = out.getvalue().splitlines()[-1]
    assert last.startswith(REPORT_MARK) and last.endswith(f"(exit 1); {kept_out}")
    assert KEEP_OUT_HINT not in out.getvalue() and last.count(kept_out) == 1
    # Its own failure first: the reason names it already.
    records, _ = _record(tmp_path, outcomes[::-1])
    out = io.StringIO()
    assert records.report(ENV, out, wait=0) == 1
    last = out.getvalue().splitlines()[-1]
    assert last.endswith(f"{kept_out} (exit 1)") and last.count(kept_out) == 1


def test_report_refuses_a_missing_or_stale_record(tmp_path):
    with pytest.raises(LaunchError, match=r"current\.json is missing"):
        RunRecords(tmp_path).report(ENV, io.StringIO())
    records, _ = _record(tmp_path, [Outcome(0, "ok")] * 2, job="an-earlier-job")
    with pytest.raises(LaunchError, match="records job an-earlier-job, not this task's job-1"):
        records.report(ENV, io.StringIO())
    records, _ = _record(tmp_path, [Outcome(0, "ok")], hosts=("10.0.0.9",), job="job-1")
    with pytest.raises(LaunchError, match="records hosts"):
        records.report(ENV, io.StringIO())
    assert json.loads(records.current.read_text())["hosts"] == ["10.0.0.9"]
    assert os.path.basename(records.root) == "logs"


# ---------------------------------------------------------------- engines

TRAINER = ["python", "-m", "trainer", "--model", "tiny", "--output-dir", "/r"]
TORCH_VARIABLES = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME",
}  # fmt: skip


def test_the_engine_is_the_launchers_own_option_never_read_from_the_worker_command():
    assert build_parser().parse_args(["--", *TRAINER]).backend == "horovod"  # the trainer's
    assert build_parser().parse_args(["--backend", "ddp", "--", *TRAINER]).backend == "ddp"
    worker_chooses = build_parser().parse_args(["--", *TRAINER, "--backend", "fsdp"])
    assert worker_chooses.backend == "horovod"  # the job passes it to both
    assert [check_engine(engine) for engine in ("horovod", "ddp", "fsdp")] == [
        "horovod",
        "ddp",
        "fsdp",
    ]


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("local", "backend=local: the launcher starts horovod, ddp, fsdp, torch workers"),
        ("mpi", "backend=mpi: the launcher starts horovod, ddp, fsdp, torch workers"),
    ],
)
def test_an_engine_the_launcher_cannot_start_is_one_line(backend, message):
    with pytest.raises(LaunchError, match=message) as refused:
        check_engine(backend)
    assert "\n" not in str(refused.value)


def test_backend_local_stops_the_launcher_before_anything_starts(monkeypatch, capsys):
    for key, value in BATCH.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as stopped:
        main(["--workers-per-node", "1", "--backend", "local", "--", *TRAINER])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: backend=local: ") and err.count("\n") == 1
    assert "run dt-train without the launcher" in err


def _node(index: int, port: int = 6105) -> Node:
    hosts = ["10.0.0.4", "10.0.0.5"]
    return Node(hosts, index, "10.0.0.4", port, index == 0, "eth0")


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_torch_engines_get_torchruns_variables_with_global_ranks_node_by_node(engine):
    base = {"PATH": "/bin", "MASTER_PORT": "6105", "NCCL_SOCKET_IFNAME": "eth0"}
    port = torch_master_port(6105, {"AZ_BATCH_MASTER_NODE": "10.0.0.4:6000"})
    assert port == 6106  # beside the launchers' own store, never Batch's 6000
    assert torch_master_port(5999, {"AZ_BATCH_MASTER_NODE": "10.0.0.4"}) == 6000
    envs = [
        env
        for index in (0, 1)
        for env in worker_envs(engine, _node(index), 8, base, port, token="t0ken")
    ]
    assert [env["RANK"] for env in envs] == [str(rank) for rank in range(16)]
    assert {env["WORLD_SIZE"] for env in envs} == {"16"}
    assert [env["LOCAL_RANK"] for env in envs] == [str(local) for local in range(8)] * 2
    assert {env["LOCAL_WORLD_SIZE"] for env in envs} == {"8"}
    assert [env["GROUP_RANK"] for env in envs] == ["0"] * 8 + ["1"] * 8
    assert all(env["NODE_RANK"] == env["GROUP_RANK"] for env in envs)
    assert {env["GROUP_WORLD_SIZE"] for env in envs} == {"2"}
    # Every rank meets rank 0's store on the master node, on the port after the rendezvous.
    assert {(env["MASTER_ADDR"], env["MASTER_PORT"]) for env in envs} == {("10.0.0.4", "6106")}
    assert {env["GLOO_SOCKET_IFNAME"] for env in envs} == {"eth0"}
    assert all(env["PATH"] == "/bin" and env["NCCL_SOCKET_IFNAME"] == "eth0" for env in envs)
    assert not any(key.startswith("HOROVOD_") for env in envs for key in env)
    assert set(torch_worker_env("10.0.0.4", 6106, "eth0", 2, 1, 8, 7)) == TORCH_VARIABLES | {
        "PYTHONUNBUFFERED"
    }


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_torch_rank_0_is_on_the_master_wherever_batch_lists_it(engine):
    """Batch does not say where AZ_BATCH_HOST_LIST puts the master; rank 0 must be there,
    where MASTER_ADDR sends every rank to its store (with rank 0 elsewhere they all wait)."""
    hosts = ["10.0.0.4", "10.0.0.5", "10.0.0.6"]
    nodes = [Node(hosts, index, "10.0.0.5", 6105, index == 1, "eth0") for index in range(3)]
    ranks = {
        node.name: [env["RANK"] for env in worker_envs(engine, node, 2, {}, 6106, token="t")]
        for node in nodes
    }
    assert ranks == {"10.0.0.5": ["0", "1"], "10.0.0.4": ["2", "3"], "10.0.0.6": ["4", "5"]}


def test_horovod_workers_keep_horovods_variables_and_the_inherited_master_port():
    base = {"PATH": "/bin", "MASTER_PORT": "6105"}
    envs = [
        env
        for index in (0, 1)
        for env in worker_envs("horovod", _node(index), 8, base, token="t0ken")
    ]
    assert [env["HOROVOD_RANK"] for env in envs] == [str(rank) for rank in range(16)]
    assert {env["HOROVOD_GLOO_RENDEZVOUS_PORT"] for env in envs} == {"6105"}
    # Horovod's client puts what follows the host and port in the path: the job's token.
    assert {env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] for env in envs} == {"10.0.0.4:6105/t0ken"}
    assert {env["MASTER_PORT"] for env in envs} == {"6105"}  # inherited, untouched
    assert not any(key in TORCH_VARIABLES - {"MASTER_PORT"} for env in envs for key in env)


@pytest.mark.parametrize(
    ("rendezvous", "batch_master", "message"),
    [
        (65535, "10.0.0.4:6000", "next port, 65536, which is not a TCP port"),
        (5999, "10.0.0.4:6000", "next port, 6000, which is Batch's own"),
    ],
)
def test_a_torch_port_that_cannot_be_used_is_one_line_naming_the_fix(
    rendezvous, batch_master, message
):
    with pytest.raises(LaunchError, match=message) as refused:
        torch_master_port(rendezvous, {"AZ_BATCH_MASTER_NODE": batch_master})
    assert "set MASTER_PORT or --port to another port" in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--workers-per-node", "0"], {}, "--workers-per-node: '0': give an integer in 1..256"),
        (["--workers-per-node=-2"], {}, "--workers-per-node: '-2': give an integer in 1..256"),
        (["--workers-per-node", "two"], {}, "--workers-per-node: 'two': give an integer"),
        (["--port", "0"], {}, "--port: '0': give an integer in 1..65535"),
        (["--port", "65536"], {}, "--port: '65536': give an integer in 1..65535"),
        (["--port=-1"], {}, "--port: '-1': give an integer in 1..65535"),
        (["--port", "http"], {}, "--port: 'http': give an integer in 1..65535"),
        ([], {"MASTER_PORT": "0"}, "MASTER_PORT=0: expected a TCP port number 1-65535"),
        ([], {"MASTER_PORT": "99999"}, "MASTER_PORT=99999: expected a TCP port"),
        ([], {"MASTER_PORT": "²"}, "MASTER_PORT=²: expected a TCP port"),
        ([], {"MASTER_PORT": " 6105"}, "MASTER_PORT= 6105: expected a TCP port"),
    ],
)
def test_bad_worker_counts_and_ports_stop_the_launcher_in_one_line(
    monkeypatch, capsys, argv, env, message
):
    for key, value in {**BATCH, **env}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--node-ip", "127.0.0.2", "--", *TRAINER])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
