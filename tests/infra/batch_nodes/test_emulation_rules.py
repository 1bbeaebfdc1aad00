"""The emulator's reading of the payloads, without nodes: the image's ENTRYPOINT/CMD, the run
options as ``docker create`` parses them, the start task's command line as Batch splits it, and
the NFS export tree the server's cloud-init leaves."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from infra.batch import CONTAINER_RUN_OPTIONS, CPU_CONTAINER_RUN_OPTIONS
from infra.cloud_init import MOUNT_POINT, render_nfs_cloud_init
from tests.batch_emulator.declared import NfsExport, PoolSpec, asked_nodes, chmod_mode
from tests.batch_emulator.image import (
    NVIDIA_ENTRYPOINT,
    PayloadError,
    batch_create_args,
    container_argv,
    docker_create_options,
    parse_run_options,
    read_dockerfile,
)
from tests.batch_emulator.outputs import output_uploads
from tests.batch_emulator.placement import place
from tests.batch_emulator.tasks import command_argv

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[3]
COMMAND = "/bin/bash -c 'exec python -m trainer.launch --report -- python -m trainer'"


def test_the_trainer_image_runs_the_task_command_line_itself(image):
    assert image.entrypoint == ()
    assert container_argv(image, COMMAND, None) == shlex.split(COMMAND)


def _dockerfile(tmp_path: Path, tail: str) -> Path:
    path = tmp_path / "Dockerfile"
    path.write_text(
        "ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04\n"
        "FROM ${BASE_IMAGE} AS base\n"
        'SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n'
        "ENV PATH=/opt/venv/bin:$PATH \\\n    A=1\n"
        f"FROM base\n{tail}"
    )
    return path


def test_an_image_entrypoint_swallows_the_command_line(tmp_path):
    """MicrosoftDocs/azure-docs #94943: the command line becomes CMD after the ENTRYPOINT."""
    image = read_dockerfile(_dockerfile(tmp_path, 'ENTRYPOINT ["python", "-m", "trainer.launch"]'))
    argv = container_argv(image, COMMAND, None)
    assert argv[:3] == ["python", "-m", "trainer.launch"] and argv[3:] == shlex.split(COMMAND)
    assert image.env_dict()["PATH"].startswith("/opt/venv/bin:/usr/local/nvidia/bin")


def test_shell_form_entrypoint_runs_under_the_stages_shell(tmp_path):
    image = read_dockerfile(_dockerfile(tmp_path, "ENTRYPOINT python -m trainer.launch"))
    assert image.entrypoint == ("/bin/bash", "-o", "pipefail", "-c", "python -m trainer.launch")


def test_the_cuda_base_entrypoint_is_inherited_unless_cleared(tmp_path):
    inherited = read_dockerfile(_dockerfile(tmp_path, 'CMD ["bash"]'))
    assert inherited.entrypoint == (NVIDIA_ENTRYPOINT,)
    cleared = read_dockerfile(_dockerfile(tmp_path, 'ENTRYPOINT []\nCMD ["bash"]'))
    assert cleared.entrypoint == () and container_argv(cleared, "", None) == ["bash"]


def _batch_args(gpu_pool: bool) -> list[str]:
    """Batch's own arguments for a task of our payload: the four Batch folders it binds."""
    root = "/mnt/batch/tasks"
    return batch_create_args(
        gpu_pool=gpu_pool,
        user=(1000, 1000),
        workdir=f"{root}/workitems/j/job-1/t/wd",
        env={"AZ_BATCH_TASK_WORKING_DIR": f"{root}/workitems/j/job-1/t/wd", "A": "x y"},
        binds=[(f"{root}/{folder}", False) for folder in ("workitems/j", "shared", "fsmounts")],
    )


@pytest.mark.parametrize(
    ("gpu_pool", "run_options"),
    [(True, CONTAINER_RUN_OPTIONS), (False, CPU_CONTAINER_RUN_OPTIONS)],
    ids=["gpu-pool", "cpu-pool"],
)
def test_our_run_options_combine_cleanly_with_batchs_own_arguments(gpu_pool, run_options):
    batch = _batch_args(gpu_pool)
    assert ("--gpus" in batch) is gpu_pool  # Batch enables the GPUs itself, on GPU pools only
    options = docker_create_options(batch, run_options)
    assert (options.network, options.ipc) == ("host", "host")
    assert options.devices == (["/dev/infiniband"] if gpu_pool else [])


@pytest.mark.parametrize(
    ("run_options", "message"),
    [
        # Batch refuses a --gpus of ours beside its own (ContainerInvalidSettings).
        ("--network host --gpus all", "--gpus"),
        ("--device /dev/infiniband --device /dev/infiniband", "--device /dev/infiniband: given"),
        ("--network host --network host", "specified multiple times"),
        ("--network host --network bridge", "conflicting options"),
        # A volume onto one of the folders Batch binds itself.
        ("-v /opt/microsoft:/mnt/batch/tasks/shared:ro", "Duplicate mount point"),
    ],
)
def test_run_options_that_clash_with_batchs_own_or_repeat_are_refused(run_options, message):
    with pytest.raises(PayloadError, match=message):
        docker_create_options(_batch_args(True), run_options)


def test_run_options_of_the_payload_are_valid_docker_create_options():
    options = parse_run_options(CONTAINER_RUN_OPTIONS)
    assert (options.network, options.ipc) == ("host", "host")
    assert options.ulimits["RLIMIT_MEMLOCK"] == (-1, -1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("--network host --gpus all", "--gpus"),
        ("--network host --frobnicate", "unknown flag"),
        ("--ulimit memlock", "--ulimit"),
        ("--ipc hots", "IPC mode"),
        ("--cap-add IPC_LOK", "unknown capability"),
        ("-v /opt/microsoft", "-v"),
        ("--shm-size", "needs an argument"),
    ],
)
def test_run_options_docker_or_batch_would_refuse(options, message):
    with pytest.raises(PayloadError, match=message):
        parse_run_options(options)


def test_the_declared_start_task_splits_into_bash_and_one_script(pool_spec: PoolSpec):
    argv = command_argv(pool_spec.start_task["commandLine"])
    assert argv[:2] == ["/bin/bash", "-c"] and len(argv) == 3


def test_a_command_line_with_broken_quoting_is_refused():
    with pytest.raises(PayloadError, match="cannot be split"):
        command_argv("/bin/bash -c 'echo 'it's''")


def test_nfs_export_tree_follows_the_servers_cloud_init():
    export = NfsExport.from_cloud_init(render_nfs_cloud_init(2, "10.20.0.0/20"), MOUNT_POINT)
    folders = {path: (uid, gid, oct(mode)) for path, uid, gid, mode in export.folders}
    assert folders[""][:2] == (0, 0)
    assert export.root_squash


@pytest.mark.parametrize(
    ("spec", "before", "after"),
    [
        ("1777", 0o755, 0o1777),
        ("a+w", 0o755, 0o777),
        ("o-rwx", 0o775, 0o770),
        ("+t", 0o777, 0o1777),
    ],
)
def test_chmod_modes(spec, before, after):
    assert chmod_mode(before, spec) == after


def test_without_namespaces_nodes_fall_back_to_loopback_and_say_so(monkeypatch):
    from tests.batch_emulator import vnet as vnet_module

    def refuse(*args, check=True):
        raise vnet_module.VNetUnavailable("ip netns add: Operation not permitted")

    monkeypatch.setattr(vnet_module, "_ip", refuse)
    with pytest.warns(UserWarning, match="NOT separate hosts"):
        net = vnet_module.VNet(nodes=2, subnet="10.20.0.0/20")
    assert not net.isolated and net.node_ips == ["127.0.0.2", "127.0.0.3"]
    assert net.exec_prefix("any") == []
    net.close()


def _output(pattern: str, path: str, condition: str) -> dict:
    return {
        "filePattern": pattern,
        "destination": {
            "container": {
                "containerUrl": "https://storage/account/logs",
                "path": path,
                "identityReference": {"resourceId": "/identity"},
            }
        },
        "uploadOptions": {"uploadCondition": condition},
    }


def test_output_files_follow_pattern_path_and_upload_condition(tmp_path):
    workdir = tmp_path / "task" / "wd"
    (workdir / "out" / "sub").mkdir(parents=True)
    (tmp_path / "task" / "stdout.txt").write_text("log")
    for name in ("out/a.txt", "out/sub/b.txt", "out/.hidden.txt"):
        (workdir / name).write_text(name)
    task = {
        "outputFiles": [
            _output("../stdout.txt", "job/stdout.txt", "taskcompletion"),
            _output("$AZ_BATCH_TASK_WORKING_DIR/out/**/*.txt", "job/out", "tasksuccess"),
            _output("../stdout.txt", "job/failed.txt", "taskfailure"),
        ]
    }
    env = {"AZ_BATCH_TASK_WORKING_DIR": str(workdir)}
    identities = {"client": "/identity"}
    succeeded = {u["blob"] for u in output_uploads(task, env, 0, identities)}
    assert succeeded == {"job/stdout.txt", "job/out/out/a.txt", "job/out/out/sub/b.txt"}
    failed = {u["blob"] for u in output_uploads(task, env, 3, identities)}
    assert failed == {"job/stdout.txt", "job/failed.txt"}
    with pytest.raises(PayloadError, match="identity"):
        output_uploads(task, env, 0, {"client": "/another"})


def test_a_pool_asking_for_low_priority_nodes_gets_spot_nodes(pool_spec, spot_cpu_stack):
    """Batch-managed accounts turn low-priority requests into Spot nodes since March 2026
    (Azure/Batch #196, read 2026-11-28): the emulated pool counts them as its Spot nodes."""
    assert (pool_spec.dedicated_nodes, pool_spec.spot_nodes) == (2, 0)
    assert (spot_cpu_stack.pool.dedicated_nodes, spot_cpu_stack.pool.spot_nodes) == (0, 2)
    formula = "$TargetDedicatedNodes = $busy ? 2 : 0;\n$TargetLowPriorityNodes = $busy ? 1 : 0;"
    scale = {"scaleSettings": {"autoScale": {"formula": formula}}}
    assert (asked_nodes(scale, "Dedicated"), asked_nodes(scale, "LowPriority")) == (2, 1)
    fixed = {"scaleSettings": {"fixedScale": {"targetLowPriorityNodes": 3}}}
    assert (asked_nodes(fixed, "Dedicated"), asked_nodes(fixed, "LowPriority")) == (0, 3)


def test_a_stack_still_setting_spot_nodes_is_told_what_replaced_it():
    from dt_commands.plan import evaluate
    from infra.settings.checks import ConfigError
    from tests.support.stacks import stack_values

    with pytest.raises(ConfigError) as refused:
        evaluate("dev", {**stack_values("dev"), "gpu-cluster:spotNodes": 1})
    message = str(refused.value)
    assert message.startswith("spotNodes: replaced by spot (the pool is all Spot or all ")
    assert "set spot: true" in message and "\n" not in message


class _N:
    def __init__(self, index: int) -> None:
        self.index = index


def test_a_moved_retry_leaves_the_failed_node_out_and_the_master_moves():
    n0, n1, n2, n3 = (_N(i) for i in range(4))
    # The first try, and a kind placement: the first usable nodes, the master last.
    assert place([n0, n1, n2], 2) == [n0, n1]
    assert place([n0, n1, n2], 2, previous=[n0, n1], failed=n0) == [n0, n1]
    # Moved: the subtask n0 failed; n1 stays, a new node comes and the primary goes to it.
    assert place([n0, n1, n2, n3], 2, placement="move", previous=[n0, n1], failed=n0) == [n1, n2]
    # The master n1 failed: the subtask stays, the primary goes to a new node.
    assert place([n0, n1, n2], 2, placement="move", previous=[n0, n1], failed=n1) == [n0, n2]
    # No node besides the failed one and the other: the task waits for nodes.
    assert place([n0, n1], 2, placement="move", previous=[n0, n1], failed=n0) is None
    with pytest.raises(ValueError, match="placement="):
        place([n0], 1, placement="elsewhere")


def test_a_blob_agent_that_never_answers_fails_the_call_and_is_stopped(monkeypatch):
    """The session's blob agent is one long-lived process: a call it never answers fails after
    BLOB_CALL_SECONDS, naming the wait, instead of hanging the test, and the agent is killed."""
    import subprocess

    from tests.batch_emulator import storage as emulator

    monkeypatch.setattr(emulator, "BLOB_CALL_SECONDS", 0.5)
    agent = emulator._BlobAgent(
        subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    )
    with pytest.raises(RuntimeError, match=r"no answer in 0\.5 s"):
        agent.ask({"action": "list"})
    assert agent.process.wait(timeout=10) != 0


def test_a_blob_agent_killed_for_not_answering_is_replaced_for_the_next_call(monkeypatch):
    """After a call the agent never answered (it was killed), the session's next Blob call
    starts a new agent instead of failing on the dead one's pipe."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from tests.batch_emulator import storage as emulator

    def process(script: str) -> subprocess.Popen[str]:
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
        return subprocess.Popen([sys.executable, "-c", script], **pipes)

    dead = emulator._BlobAgent(process("import time; time.sleep(60)"))
    monkeypatch.setattr(emulator, "BLOB_CALL_SECONDS", 0.5)
    with pytest.raises(RuntimeError, match="no answer"):
        dead.ask({"action": "list"})
    dead.process.wait(timeout=10)
    echo = (
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    print(json.dumps({'result': json.loads(line)['action']}), flush=True)\n"
    )
    started = []

    def start(cls, vnet, account):
        started.append(cls(process(echo)))
        return started[-1]

    monkeypatch.setattr(emulator._BlobAgent, "start", classmethod(start))
    account = SimpleNamespace(blob_endpoint="https://emulated/", connection_string=lambda: "")
    monkeypatch.setitem(emulator._blob_agents, account.blob_endpoint, dead)
    assert emulator.blob(None, account, "list") == "list"
    assert len(started) == 1 and emulator._blob_agents[account.blob_endpoint] is started[0]
    started[0].close()
