"""The multi-node launcher with two simulated nodes on 127.0.0.1 (two launcher processes), and
the job's own task command lines run as a node runs them."""

import json
import signal
import time
from pathlib import Path

import pytest

from infra.batch import task_options
from infra.job_spec import JobSpec
from tests.support.container import one_node_pool, run_in_container
from tests.support.fake_imds import event as fake_event
from tests.support.fake_imds import serving
from tests.support.launchers import read_metrics
from tests.trainer.launch.launch_nodes import (
    free_port,
    held_port,
    report,
    start_nodes,
    trainer_command,
)

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


def _wait_all(processes, timeout):
    deadline = time.monotonic() + timeout
    codes = []
    for process in processes:
        codes.append(process.wait(timeout=max(1, deadline - time.monotonic())))
    return codes


def _logs(tmp_path):
    return "\n".join((tmp_path / f"node{i}.log").read_text() for i in (0, 1))


def _stale_records(output_dir: Path) -> None:
    """What a failed earlier attempt left in the run folder (a retry reuses it to resume)."""
    old = output_dir / "logs" / "old-attempt"
    old.mkdir(parents=True)
    for host in ("127.0.0.1", "127.0.0.2"):
        (old / f"launch-{host}.log").write_text("STALE LOG\n")
        outcome = {"attempt": "old-attempt", "host": host, "code": 7, "reason": "STALE FAILURE"}
        (old / f"outcome-{host}.json").write_text(json.dumps(outcome))
    current = {"attempt": "old-attempt", "hosts": ["127.0.0.1", "127.0.0.2"], "job": "sim-job"}
    (output_dir / "logs" / "current.json").write_text(json.dumps(current))


def test_two_nodes_train_beside_batchs_reserved_port_and_the_primary_reports_both(tmp_path):
    out = tmp_path / "run"
    _stale_records(out)
    command = trainer_command(out, "--epochs", "2", "--preflight-min-busbw", "0.0001")
    # Batch itself listens on the port in AZ_BATCH_MASTER_NODE: the rendezvous must not use it.
    with held_port() as batch_port:
        nodes = start_nodes(
            tmp_path,
            command,
            "--defer-exit-code",
            "--preflight",  # the launcher's, before the workers (the trainer's own comes after)
            "on",
            run_dir=out,
            batch_port=batch_port,
        )
        assert _wait_all(nodes, 120) == [0, 0], _logs(tmp_path)
    logs = _logs(tmp_path)
    assert "node 1/2: starting 1 worker(s)" in logs and "node 2/2" in logs
    # One pair of CPU nodes: measured, but with no size floor nothing to compare it with.
    assert "preflight: nodes 127.0.0.1 and 127.0.0.2: 2 workers, allreduce" in logs
    assert "not judged" in logs and "preflight: passed in" in logs
    assert "preflight: allreduce bus bandwidth" in logs
    assert "done: step 8 (started at 0, stopped by epochs), 2 worker(s)" in logs
    assert read_metrics(out)[-1]["step"] == 8
    # Both nodes trained through the master's store with this launch's token, which the
    # second node read from the run folder: readable by any node's task uid, written by no one
    # but its owner (trainer.launch.rendezvous TOKEN_FILE_MODE).
    assert (out / "logs" / "rendezvous.token").stat().st_mode & 0o777 == 0o644
    reported = report(out, command)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    text = reported.stdout
    assert "===== node 1/2 127.0.0.1" in text and "===== node 2/2 127.0.0.2" in text
    # The second node's own log reached the primary through the shared run folder.
    assert "[launch 127.0.0.2] node 2/2: starting 1 worker(s)" in text
    assert "done: step 8" in text and "every node finished" in text.splitlines()[-1]
    assert "STALE" not in text


def test_preflight_below_the_floor_stops_both_nodes_and_the_report_fails_naming_it(tmp_path):
    command = trainer_command(tmp_path / "run", "--preflight-min-busbw", "100000")
    nodes = start_nodes(tmp_path, command, "--defer-exit-code", run_dir=tmp_path / "run")
    assert _wait_all(nodes, 120) == [0, 0], _logs(tmp_path)  # recorded, the report decides
    logs = _logs(tmp_path)
    assert "below the 100000 GB/s floor" in logs
    # A collective cannot tell which node held it up: the trainer's check names none.
    assert "slowest" not in logs and "times each node and each pair of nodes" in logs
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir()
    )
    reported = report(tmp_path / "run", command)
    assert reported.returncode != 0
    assert "below the 100000 GB/s floor" in reported.stdout
    assert "===== node 2/2 127.0.0.2" in reported.stdout
    assert "failed: node 127.0.0." in reported.stdout.splitlines()[-1]


def test_sigterm_to_the_launchers_reaches_the_workers_which_checkpoint_and_exit_0(tmp_path):
    out = tmp_path / "run"
    command = trainer_command(out, "--epochs", "200", "--log-every", "1")
    nodes = start_nodes(tmp_path, command, run_dir=out)
    deadline = time.monotonic() + 90
    while not read_metrics(out):
        assert time.monotonic() < deadline and all(n.poll() is None for n in nodes)
        time.sleep(0.2)
    for node in nodes:
        node.send_signal(signal.SIGTERM)
    assert _wait_all(nodes, 30) == [0, 0], _logs(tmp_path)
    assert "forwarding to the workers so they checkpoint" in _logs(tmp_path)
    assert any((out / "checkpoints").iterdir())
    assert report(out).returncode != 0  # interrupted: not a finished run


def test_a_spot_eviction_notice_on_one_node_checkpoints_every_rank_is_approved_and_waited_out(
    tmp_path,
):
    """Both nodes' metadata services (one placement group) list a Preempt of node 2: its
    launcher signals its worker, the trainer stops every rank at the same step with a
    checkpoint, and only then is the event approved. Node 1's launcher finishes; node 2's waits
    for the platform to take its VM (Batch then requeues the task without counting a retry),
    which this test does once the approval came."""
    out = tmp_path / "run"
    with serving("node-1") as quiet, serving("node-2") as evicted:
        nodes = start_nodes(
            tmp_path,
            trainer_command(out, "--epochs", "200", "--log-every", "1"),
            "--watch-scheduled-events",
            run_dir=out,
            node_env=({"AZURE_IMDS_URL": quiet.url}, {"AZURE_IMDS_URL": evicted.url}),
        )
        deadline = time.monotonic() + 90
        while not read_metrics(out):
            assert time.monotonic() < deadline and all(n.poll() is None for n in nodes)
            time.sleep(0.2)
        quiet.events = evicted.events = [fake_event("spot-1", "Preempt", ["node-2"])]
        assert nodes[0].wait(timeout=60) == 0, _logs(tmp_path)
        deadline = time.monotonic() + 60
        while not evicted.approved:
            assert time.monotonic() < deadline and nodes[1].poll() is None, _logs(tmp_path)
            time.sleep(0.2)
        assert nodes[1].poll() is None, _logs(tmp_path)  # waiting to be taken
        nodes[1].kill()  # the platform takes the VM
        nodes[1].wait()
        logs = _logs(tmp_path)
        assert "scheduled event Preempt spot-1" in logs and "checkpoint now" in logs
        assert "waiting for the platform to take this VM" in logs
        assert evicted.approved == [{"StartRequests": [{"EventId": "spot-1"}]}]
        assert quiet.approved == []
        assert any((out / "checkpoints").iterdir())
        steps = [record["step"] for record in read_metrics(out) if "epoch_end" not in record]
        assert steps  # both ranks stopped together: the run wrote metrics to the last step
        assert "Traceback" not in logs


WORKER_STUB = """#!/bin/bash
# python on the node: the real one, except that a worker ("python -m trainer ...") only records
# what it was given (eight real trainers would not fit on this machine).
if [ "$1" = -m ] && [ "$2" = trainer ]; then
    echo "$HOROVOD_RANK/$HOROVOD_SIZE $*" >> "$WORKERS_RAN"
    echo "worker $HOROVOD_RANK of $HOROVOD_SIZE ran"
    exit "${WORKER_EXIT:-0}"
fi
exec %s "$@"
"""


def test_the_jobs_task_command_lines_train_then_report_on_a_one_node_pool(tmp_path):
    spec = JobSpec(
        stack="sim",
        endpoint="https://batch.example",
        account_id="/subscriptions/s/batchAccounts/b",
        pool_id="ib-gpu",
        node_count=1,
        vm_size="Standard_ND96isr_H100_v5",
        image_ref="acr.example/trainer:1@sha256:" + "a" * 64,
        registry_server="acr.example",
        node_identity_id="/identities/n",
        node_identity_client_id="client",
        blob_endpoint="https://data.example/",
        trainer_args=("--model", "tiny", "--epochs", "1"),
        dataset_prefix="",
        trainer_settings=(("model", "tiny"), ("epochs", "1")),
    )
    task = task_options(spec)
    with held_port() as batch_port:
        env, workdir, ran = one_node_pool(
            tmp_path, WORKER_STUB, spec.job_id, batch_port, free_port()
        )
        # This CPU machine stands in for an H100 node: no GPUs for the launcher's preflight.
        env = {**env, "DT_PREFLIGHT": "off"}
        coordination = task.multi_instance_settings.coordination_command_line
        # Attempt 1: a worker fails. The coordination command records it and returns 0; the
        # application command prints the log and fails the task (Batch retries it).
        first = run_in_container(coordination, {**env, "WORKER_EXIT": "3"}, workdir)
        assert first.returncode == 0, first.stderr
        failed = run_in_container(task.command_line, env, workdir)
        assert failed.returncode == 3, failed.stdout + failed.stderr
        assert "worker 0 of 8 ran" in failed.stdout and "exited with 3" in failed.stdout
        # Attempt 2 (the retry, same run folder): succeeds, and the report says so.
        ran.unlink()
        second = run_in_container(coordination, env, workdir)
        assert second.returncode == 0, second.stderr
        passed = run_in_container(task.command_line, env, workdir)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "exited with 3" not in passed.stdout
    assert "every node finished" in passed.stdout.splitlines()[-1]
    output_dir = f"{tmp_path}/fsmounts/shared/runs/sim/{spec.run_name}"
    workers = sorted(ran.read_text().splitlines())
    assert [line.split()[0] for line in workers] == [f"{rank}/8" for rank in range(8)]
    ending = (
        f"--output-dir {output_dir} --metrics-upload-url {spec.metrics_url} "
        f"--outputs-url {spec.outputs_url} --checkpoint-mirror-url {spec.checkpoint_mirror_url} "
        "--preflight-min-busbw 245.0"
    )
    assert all(line.endswith(ending) for line in workers)
