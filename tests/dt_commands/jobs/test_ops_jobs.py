"""``dt-jobs list|metrics|tensorboard`` and ``--job``: the stack's ``jobs``
output, the Batch state from an autospec of the real BatchClient, and what the trainer uploaded from
Azurite over HTTPS, read with DefaultAzureCredential (a managed identity here, as ``az login``
would be on a laptop)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import threading
import time
import urllib.request
from unittest.mock import create_autospec

import pytest
from azure.batch import BatchClient
from azure.batch import models as m
from azure.core.exceptions import ResourceNotFoundError

from dt_commands.jobs.main import main
from dt_commands.jobs.metrics import metrics
from dt_commands.jobs.tensorboard import start_tensorboard, tensorboard
from dt_commands.stack_outputs import select_job
from infra import credentials
from infra.live_metrics import StorageError, blob_container
from tests.support.ports import free_port
from trainer.watch.noise_scale import advice

ENDPOINT = "platformbatch.eastus.batch.azure.com"


def _train(step, rate, loss=2.0, epoch=0):
    return {
        "kind": "train",
        "step": step,
        "epoch": epoch,
        "loss": loss,
        "lr": 0.1,
        "accuracy": 0.5,
        "images_per_sec": rate / 2,
        "images_per_sec_total": rate,
    }


def _entry(job_id, metrics_url, nodes=2):
    return {
        "job_id": job_id,
        "job_state": "active",
        "job_log_url": metrics_url.removesuffix("live/"),
        "job_checkpoint_path": f"shared/runs/dev/{job_id[-6:]}",
        "job_portal_url": "https://portal.azure.com/#resource/x/jobs",
        "node_count": nodes,
        "metrics_url": metrics_url,
    }


def _outputs(tmp_path, outputs):
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(outputs))
    return ["--stack", "dev", "--outputs-file", str(path)]


def _stack(logs_url, *names):
    """The outputs a stack with these jobs exports (``jobs`` plus the shared outputs), each job
    uploading to ``<logs_url><name>/live/``."""
    jobs = {
        name: _entry(f"dev-{name}-{i}a2b3c4d5e", f"{logs_url}{name}/live/")
        for i, name in enumerate(names)
    }
    outputs = {"batch_account_endpoint": ENDPOINT, "image_ref": "acr.io/trainer:1", "jobs": jobs}
    if len(jobs) == 1:
        (only,) = jobs.values()
        outputs.update({k: v for k, v in only.items() if k.startswith("job_")})
    return outputs


def _url(entra, logs):
    return entra.folder_url(logs.container_name, "")


def _upload_metrics(logs, prefix, records, tail=b""):
    data = b"".join(json.dumps(r).encode() + b"\n" for r in records) + tail
    logs.upload_blob(f"{prefix}metrics.jsonl", data, overwrite=True)


def _run(capsys, argv, **kwargs):
    """main() -> (exit code, stdout, stderr); errors exit through SystemExit."""
    try:
        code = main(argv, **kwargs)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---------------------------------------------------------------------- which job
def test_job_picks_from_the_jobs_output_and_status_shows_that_job(tmp_path, capsys):
    outputs = _stack("https://acct.blob.core.windows.net/logs/", "resnet", "vit")
    client = create_autospec(BatchClient, instance=True)
    client.get_job.return_value = m.BatchJob(state="active")
    client.get_task.return_value = m.BatchTask(state="running")
    argv = ["status", *_outputs(tmp_path, outputs), "--job", "vit"]
    code, out, _ = _run(capsys, argv, client_factory=lambda endpoint: client)
    assert code == 0
    assert "job         dev-vit-1a2b3c4d5e: active" in out
    assert "checkpoints shared/runs/dev/3c4d5e" in out and "image       acr.io/trainer:1" in out
    assert f"metrics     {outputs['jobs']['vit']['metrics_url']}" in out
    client.get_task.assert_called_once_with("dev-vit-1a2b3c4d5e", "train")

    code, _, err = _run(capsys, ["status", *_outputs(tmp_path, outputs)])
    assert code == 2
    assert err == "error: stack=dev: has 2 jobs (resnet, vit); pass --job NAME\n"
    code, _, err = _run(capsys, ["cancel", *_outputs(tmp_path, outputs), "--job", "bert"])
    assert code == 2
    assert err == "error: job=bert: stack dev has no such job; its jobs: resnet, vit\n"


def test_a_stack_without_a_jobs_output_has_its_one_job_at_the_top_level():
    outputs = {
        "batch_account_endpoint": ENDPOINT,
        "job_id": "dev-892e482eaf",
        "job_log_url": "https://acct.blob.core.windows.net/logs/dev-892e482eaf/",
    }
    job = select_job(outputs, "dev", None)
    assert (job.name, job.job_id) == ("default", "dev-892e482eaf")
    assert job.metrics is not None
    assert job.metrics.url == "https://acct.blob.core.windows.net/logs/dev-892e482eaf/live/"
    assert select_job(outputs, "dev", "default").job_id == "dev-892e482eaf"


WRONG_SHAPES = [
    ({"jobs": ["a"]}, "output jobs must map job names to objects, got a list"),
    ({"jobs": None}, "output jobs must map job names to objects, got null"),
    ({"jobs": {}}, "has no jobs (its jobs output is empty)"),
    ({"jobs": {"a": "dev-a"}}, "output jobs.a must be an object, got a string"),
    ({"jobs": {"a": None}}, "output jobs.a must be an object, got null"),
    ({"jobs": {"a": {"job_state": "active"}}}, "output jobs.a has no job_id"),
    ({"jobs": {"a": {"job_id": 7}}}, "output jobs.a has no job_id (a string)"),
    (
        {"jobs": {"a": {"job_id": "dev-a", "node_count": "two"}}},
        "output jobs.a.node_count='two': must be an integer",
    ),
    (
        {"jobs": {"a": {"job_id": "dev-a", "metrics_url": "http://acct/logs/x/"}}},
        "output jobs.a.metrics_url='http://acct/logs/x/': must be an https://",
    ),
    (
        {"jobs": {"a": {"job_id": "dev-a", "metrics_url": ["x"]}}},
        "output jobs.a.metrics_url=['x']: must be an https://",
    ),
    ({}, "has no job_id output (nor jobs)"),
    ({"azureml_compute_name": "platform58b0215a"}, "has no job_id output (nor jobs)"),
    ({"job_id": ["dev-a"]}, "output job_id has no job_id (a string)"),
    (
        {"job_id": "dev-a", "node_count": "two"},
        "output node_count='two': must be an integer",
    ),
]


@pytest.mark.parametrize(("outputs", "message"), WRONG_SHAPES)
@pytest.mark.parametrize("command", ["list", "metrics", "tensorboard", "status"])
def test_wrong_shaped_outputs_are_one_line_errors(tmp_path, capsys, command, outputs, message):
    client = create_autospec(BatchClient, instance=True)
    argv = [command, *_outputs(tmp_path, {"batch_account_endpoint": ENDPOINT, **outputs})]
    code, out, err = _run(capsys, argv, client_factory=lambda endpoint: client)
    assert code == 2
    path = tmp_path / "outputs.json"
    assert err.startswith(f"error: outputs_file={path}: {message}") and err.count("\n") == 1, err
    assert out == ""
    client.get_job.assert_not_called()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"[1, 2]",
            "the outputs must be a JSON object (of `pulumi stack output --json`), got a list",
        ),
        (b"null", "the outputs must be a JSON object"),
        (b'"dev"', "got a string"),
        (b"42", "got a number"),
        (b"true", "got a boolean"),
        (b"{", "not JSON (Expecting property name"),
        (b"", "not JSON (Expecting value"),
        (b"[" * 100_000, "not JSON (nested too deeply)"),
        ('{"job_id": "café"}'.encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 15)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text (byte 0x89 at offset 0)"),
    ],
)
def test_an_outputs_file_of_the_wrong_kind_is_one_line_naming_the_file(
    tmp_path, capsys, content, message
):
    path = tmp_path / "outputs.json"
    path.write_bytes(content)
    for command in ("list", "status"):
        code, out, err = _run(capsys, [command, "--stack", "dev", "--outputs-file", str(path)])
        assert (code, out) == (2, "")
        assert err.startswith(f"error: outputs_file={path}: ") and err.count("\n") == 1, err
        assert message in err, err


def test_an_outputs_file_in_utf16_is_read_as_json_reads_it(tmp_path, capsys):
    path = tmp_path / "outputs.json"
    path.write_bytes(json.dumps(["x"]).encode("utf-16"))
    code, _, err = _run(capsys, ["list", "--stack", "dev", "--outputs-file", str(path)])
    assert code == 2 and "got a list" in err
    code, _, err = _run(capsys, ["list", "--stack", "dev", "--outputs-file", str(tmp_path)])
    assert code == 2 and err.startswith(f"error: outputs_file={tmp_path}: cannot read it")


def test_outputs_that_are_not_an_object_and_a_missing_endpoint_are_one_line_errors(
    tmp_path, capsys
):
    path = tmp_path / "outputs.json"
    code, _, err = _run(capsys, ["list", *_outputs(tmp_path, ["x"])])
    assert (code, err) == (2, f"error: outputs_file={path}: the outputs must be a JSON object (of "
                                  "`pulumi stack output --json`), got a list\n")  # fmt: skip
    code, _, err = _run(capsys, ["list", *_outputs(tmp_path, {"jobs": {"a": {"job_id": "x"}}})])
    assert (code, err) == (2, f"error: outputs_file={path}: has no batch_account_endpoint output; "
                                  "is `pulumi up` done?\n")  # fmt: skip


# ---------------------------------------------------------------------- metrics
def test_metrics_prints_the_last_steps_and_the_throughput(tmp_path, capsys, entra_env, logs):
    outputs = _stack(_url(entra_env, logs), "resnet", "vit")
    records = [_train(step, 100.0 * step, loss=5 - step / 10) for step in range(1, 13)]
    evaluation = {"kind": "eval", "step": 6, "epoch": 0, "val_loss": 4.2, "val_accuracy": 0.25}
    records.insert(6, evaluation)
    # An upload taken while the trainer appended a line: the cut line is skipped.
    _upload_metrics(logs, "resnet/live/", records, tail=b'{"kind": "train", "st')
    tokens = entra_env.imds.tokens_issued
    argv = ["metrics", *_outputs(tmp_path, outputs), "--job", "resnet", "--last", "3"]
    code, out, err = _run(capsys, argv)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    url = outputs["jobs"]["resnet"]["metrics_url"]
    assert lines[0].startswith(f"job resnet (dev-resnet-0a2b3c4d5e): {url}metrics.jsonl, uploaded ")
    assert [line.split() for line in lines[1:5]] == [
        ["step", "epoch", "loss", "images/s"],
        ["10", "0", "4.0000", "1000.0"],
        ["11", "0", "3.9000", "1100.0"],
        ["12", "0", "3.8000", "1200.0"],
    ]
    assert lines[5] == (
        "throughput: 1100.0 images/s total, mean of the last 3 logged steps "
        "(650.0 over all 12 in the file)"
    )
    assert lines[6] == "last evaluation: step 6, epoch 0, loss 4.2000, accuracy 0.2500"
    assert entra_env.imds.tokens_issued > tokens  # a bearer token, not a key


def test_metrics_of_a_language_model_count_tokens_and_give_the_noise_scale_advice(
    tmp_path, capsys, entra_env, logs
):
    outputs = _stack(_url(entra_env, logs), "resnet", "vit")
    records = [
        {"kind": "train", "step": step, "epoch": 0, "loss": 3.0, "tokens_per_sec_total": 5e4}
        for step in (1, 2)
    ]
    records.append({"kind": "noise", "step": 2, "global_batch": 256, "noise_scale": 2048.0})
    _upload_metrics(logs, "resnet/live/", records)
    argv = ["metrics", *_outputs(tmp_path, outputs), "--job", "resnet"]
    code, out, err = _run(capsys, argv)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1].split() == ["step", "epoch", "loss", "tokens/s"]
    assert lines[4].startswith("throughput: 50000.0 tokens/s total")
    assert lines[-1] == advice(2048.0, 256)
    assert "scaling beyond about 8.0x" in lines[-1]


def test_metrics_name_the_latest_windows_stragglers(tmp_path, capsys, entra_env, logs):
    outputs = _stack(_url(entra_env, logs), "resnet", "vit")
    slow = {"kind": "straggler", "step": 2, "rank": 1, "host": "node-1", "metric": "compute_sec",
            "seconds": 0.5, "others_sec": 0.25, "excess_of_step": 0.5}  # fmt: skip
    _upload_metrics(logs, "resnet/live/", [_train(1, 10.0), _train(2, 10.0), slow])
    code, out, err = _run(capsys, ["metrics", *_outputs(tmp_path, outputs), "--job", "resnet"])
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == (
        "straggler: rank 1 on node-1: compute_sec 0.500s per step against 0.250s on the other "
        "ranks, 50% of a step slower (step 2)"
    )


def test_metrics_before_any_upload_and_without_credentials_are_one_line_errors(
    tmp_path, capsys, entra_env, logs, monkeypatch
):
    argv = ["metrics", *_outputs(tmp_path, _stack(_url(entra_env, logs), "resnet"))]
    code, _, err = _run(capsys, argv)
    assert code == 1 and err.count("\n") == 1
    assert "resnet/live/metrics.jsonl: nothing uploaded yet" in err

    _upload_metrics(logs, "resnet/live/", [_train(1, 10.0)])
    monkeypatch.setenv("AZURE_CLIENT_ID", "an-identity-this-machine-does-not-have")
    monkeypatch.setenv("PATH", str(tmp_path))  # no az CLI either
    credentials.credential.cache_clear()
    code, _, err = _run(capsys, argv)
    assert code == 1 and err.count("\n") == 1, err
    assert "metrics.jsonl: cannot authenticate (" in err and "log in with `az login`" in err


class RefusingBlob:
    """A blob client answering as Storage does from an address outside storageAllowedIps."""

    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            from azure.core.exceptions import HttpResponseError

            error = HttpResponseError(
                message="This request is not authorized to perform this operation.\n"
                "RequestId:5f1c\nTime:2026-11-22T11:00:30Z\nErrorCode:AuthorizationFailure"
            )
            error.status_code = 403
            error.error_code = "AuthorizationFailure"  # azure-storage-blob's, from the header
            raise error

        return refuse


def test_a_refused_read_names_the_roles_and_storage_allowed_ips():
    container = type("Container", (), {"get_blob_client": lambda self, name: RefusingBlob()})()
    job = select_job(_stack("https://acct.blob.core.windows.net/logs/", "resnet"), "dev", None)
    with pytest.raises(StorageError) as caught:
        metrics(container, job.metrics, job, io.StringIO())
    assert str(caught.value) == (
        "https://acct.blob.core.windows.net/logs/resnet/live/metrics.jsonl: This request is not "
        "authorized to perform this operation (403 AuthorizationFailure: the account's firewall "
        "refused this machine's address); add it to the stack's storageAllowedIps"
    )
    assert caught.value.code == 1


# ---------------------------------------------------------------------- tensorboard
def _event_file(folder, tag="train/loss"):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for step in range(3):
        writer.add_scalar(tag, 1.0 / (step + 1), step)
    writer.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path


def test_tensorboard_copies_what_changed_into_the_default_folder(
    tmp_path, capsys, entra_env, logs, monkeypatch
):
    outputs = _stack(_url(entra_env, logs), "resnet")
    logs.upload_blob("resnet/live/tensorboard/events.out.tfevents.1.n.1", b"first")
    logs.upload_blob("resnet/live/tensorboard/eval/events.out.tfevents.2.n.1", b"second")
    logs.upload_blob("resnet/live/metrics.jsonl", b"{}\n")  # not a TensorBoard file
    monkeypatch.chdir(tmp_path)
    argv = ["tensorboard", *_outputs(tmp_path, outputs), "--no-start"]
    code, out, err = _run(capsys, argv)
    assert (code, err) == (0, "")
    dest = tmp_path / "runs/dev/resnet/tensorboard"
    assert out == (
        f"job resnet (dev-resnet-0a2b3c4d5e): 2 TensorBoard file(s) copied, 0 unchanged, in "
        f"{dest.relative_to(tmp_path)}\n"
    )
    assert (dest / "events.out.tfevents.1.n.1").read_bytes() == b"first"
    assert (dest / "eval/events.out.tfevents.2.n.1").read_bytes() == b"second"
    assert sorted(p.name for p in dest.rglob("*") if p.is_file()) == [
        "events.out.tfevents.1.n.1",
        "events.out.tfevents.2.n.1",
    ]

    logs.upload_blob("resnet/live/tensorboard/events.out.tfevents.1.n.1", b"first+", overwrite=True)
    code, out, _ = _run(capsys, argv)
    assert code == 0 and "1 TensorBoard file(s) copied, 1 unchanged" in out
    assert (dest / "events.out.tfevents.1.n.1").read_bytes() == b"first+"


def test_tensorboard_before_any_upload_is_a_one_line_error(tmp_path, capsys, entra_env, logs):
    argv = [
        "tensorboard",
        *_outputs(tmp_path, _stack(_url(entra_env, logs), "resnet")),
        "--no-start",
    ]
    argv += ["--dir", str(tmp_path / "tb")]
    code, _, err = _run(capsys, argv)
    assert code == 1 and err.count("\n") == 1
    assert "resnet/live/tensorboard/: no TensorBoard files uploaded yet" in err


def test_tensorboard_serves_the_synced_files_and_keeps_syncing(tmp_path, entra_env, logs):
    outputs = _stack(_url(entra_env, logs), "resnet")
    event = _event_file(tmp_path / "made")
    logs.upload_blob(f"resnet/live/tensorboard/{event.name}", event.read_bytes())
    job = select_job(outputs, "dev", None)
    dest = tmp_path / "tb"
    started: list[subprocess.Popen] = []
    log_path = tmp_path / "tensorboard.log"

    def start(command):
        with open(log_path, "w") as log:
            # Another working directory: the command finds dt_commands.jobs.tensorboard_cli by
            # itself.
            process = start_tensorboard(command, stderr=log, cwd=tmp_path)
        started.append(process)
        return process

    out = io.StringIO()
    result: list[int] = []
    args = (blob_container(job.metrics), job.metrics, job, dest, out)
    runner = threading.Thread(
        target=lambda: result.append(tensorboard(*args, start=start, port=0, sync_seconds=0.3))
    )
    runner.start()
    try:
        deadline = time.monotonic() + 120
        address = None
        while address is None:
            assert time.monotonic() < deadline, log_path.read_text() if log_path.exists() else ""
            found = (
                re.search(r"at (http://\S+/) ", log_path.read_text()) if log_path.exists() else None
            )
            address = found and found.group(1)
            time.sleep(0.2)
        with urllib.request.urlopen(f"{address}data/plugin/scalars/tags", timeout=30) as reply:
            tags = json.load(reply)
        assert "train/loss" in tags["."]  # the synced event file, read by TensorBoard

        logs.upload_blob("resnet/live/tensorboard/resumed/events.out.tfevents.9.n.1", b"later")
        deadline = time.monotonic() + 60
        while not (dest / "resumed/events.out.tfevents.9.n.1").exists():
            assert time.monotonic() < deadline, "the running TensorBoard's folder was not synced"
            time.sleep(0.1)
    finally:
        for process in started:
            process.terminate()
        runner.join(timeout=60)
    assert result == [started[0].returncode]  # TensorBoard's own exit code: it stopped
    assert started[0].args[1:] == [
        "-m",
        "dt_commands.jobs.tensorboard_cli",
        "--logdir",
        str(dest),
        "--port",
        "0",
    ]
    assert "synced 1 new or grown TensorBoard file(s)" in out.getvalue()


# ---------------------------------------------------------------------- list
def test_list_shows_every_job_with_state_nodes_retries_step_and_rate(
    tmp_path, capsys, entra_env, logs
):
    outputs = _stack(_url(entra_env, logs), "bert", "resnet", "vit")
    outputs["jobs"]["vit"]["metrics_url"] = (
        f"https://127.0.0.1:{free_port()}/devstoreaccount1/logs/vit/live/"  # unreachable
    )
    del outputs["jobs"]["bert"]["node_count"]  # then the task's instances
    # What the stack's last refresh recorded for vit, whose metrics this machine cannot reach.
    recorded_at = "2026-11-20T10:00:00+00:00"
    outputs["jobs"]["vit"].update(step=1200, images_per_sec=950.0, progress_at=recorded_at)
    _upload_metrics(
        logs, "resnet/live/", [_train(s, 800.0 + s) for s in range(1, 2000)]
    )  # more than the tail read: the cut first line is skipped
    # A language model's run: its rate counts tokens.
    bert = [{"kind": "train", "step": 7, "epoch": 0, "loss": 3.1, "tokens_per_sec_total": 5120.0}]
    _upload_metrics(logs, "bert/live/", [*bert, {"kind": "eval", "step": 7, "epoch": 0}])
    client = create_autospec(BatchClient, instance=True)
    jobs = {
        "dev-bert-0a2b3c4d5e": m.BatchJob(state="active"),
        "dev-resnet-1a2b3c4d5e": m.BatchJob(state="active"),
    }
    tasks = {
        "dev-resnet-1a2b3c4d5e": m.BatchTask(
            state="running",
            execution_info=m.BatchTaskExecutionInfo(retry_count=1, requeue_count=0),
        ),
        "dev-bert-0a2b3c4d5e": m.BatchTask(
            state="active",
            multi_instance_settings=m.MultiInstanceSettings(
                number_of_instances=4, coordination_command_line="x"
            ),
        ),
    }

    def get(table):
        def lookup(job_id, *rest):
            if job_id not in table:
                raise ResourceNotFoundError("The specified job does not exist.")
            return table[job_id]

        return lookup

    client.get_job.side_effect = get(jobs)
    client.get_task.side_effect = get(tasks)
    code, out, err = _run(
        capsys, ["list", *_outputs(tmp_path, outputs)], client_factory=lambda endpoint: client
    )
    assert code == 0
    assert [line.split() for line in out.splitlines()] == [
        ["NAME", "JOB", "ID", "JOB", "TASK", "NODES", "RETRIES", "STEP", "THROUGHPUT"],
        ["bert", "dev-bert-0a2b3c4d5e", "active", "active", "4", "-", "7", "5120.0", "tokens/s"],
        [
            "resnet",
            "dev-resnet-1a2b3c4d5e",
            "active",
            "running",
            "2",
            "1",
            "1999",
            "2799.0",
            "images/s",
        ],
        [
            "vit",
            "dev-vit-2a2b3c4d5e",
            "not",
            "found",
            "-",
            "2",
            "-",
            "1200",
            "(as",
            "of",
            f"{recorded_at})",
            "950.0",
            "images/s",
        ],
    ]
    assert err.count("\n") == 1 and err.startswith("note: job vit: metrics: https://127.0.0.1:")
    assert "cannot reach it" in err


@pytest.mark.parametrize("port", ["0", "65536", "-1", "http", "６００６"])
def test_a_tensorboard_port_out_of_range_is_one_line_before_anything_runs(tmp_path, capsys, port):
    argv = ["tensorboard", "--stack", "dev", "--outputs-file", str(tmp_path / "none.json")]
    code, out, err = _run(capsys, [*argv, "--port", port])
    assert (code, out) == (2, "")
    assert err == (
        f"error: argument --port: {port!r} is not a TCP port; give one in 1..65535 (see --help)\n"
    )
