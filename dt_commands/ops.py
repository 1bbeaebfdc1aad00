"""``dt-jobs list|status|logs|cancel|metrics|tensorboard|fetch --stack NAME
[--job NAME]``: follow the stack's training jobs.

An operator CLI: it runs where `pulumi up` runs, not in the trainer image.

The jobs' ids and the Batch endpoint come from the stack outputs (``pulumi stack output --json``,
or a file of them with ``--outputs-file``): the ``jobs`` map (name -> that job's outputs), or a
stack's single job at the top level. The Batch calls use the process's one credential
(``infra.credentials``) with the data-plane roles the stack grants its job submitters.

``metrics``, ``tensorboard`` and the last columns of ``list`` read what the trainer's rank 0
uploads to the job's ``metrics_url`` (``trainer.live_upload``): the nodes and their NFS run folder
are in a private network, the Blob account is reachable from the addresses in storageAllowedIps.
Those reads use the same credential (``az login``; Storage Blob Data Reader).
``fetch`` downloads a finished run's results from the job's ``outputs_url`` (dt_commands/fetch.py).
``sweep`` measures how far a job scales, on the stack's pool or locally (dt_commands/sweep.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, TextIO

from dt_commands import sweep
from dt_commands.fetch import fetch_job
from dt_commands.stack_outputs import (
    Job,
    JobsError,
    OutputsError,
    read_outputs,
    require,
    select_job,
    stack_jobs,
)
from infra import batch
from infra.batch import TASK_ID, state_text, terminate_job
from infra.image_inputs import REPO
from infra.live_metrics import (
    METRICS_FILE,
    NotUploaded,
    StorageError,
    blob_container,
    latest_step,
    noise_advice,
    number,
    rate_key,
    read_metrics,
    storage_errors,
    train_records,
)
from infra.pool_health import pool_problems
from trainer.blob_folder import BlobFolder
from trainer.cli import OneLineParser, fail, positive_int

POLL_SECONDS = 5.0
TENSORBOARD_FOLDER = "tensorboard/"
TENSORBOARD_SYNC_SECONDS = 60.0
TENSORBOARD_PORT = 6006  # TensorBoard's own default
LAST_STEPS = 10


def pool_lines(client: Any, job: Any, cancel_hint: str) -> list[str]:
    """Why the job's pool gives it no nodes (infra.pool_health); a credential that may not read
    the pool gets one line saying so instead."""
    from azure.core.exceptions import HttpResponseError

    pool_id = job.pool_info.pool_id if job.pool_info is not None else None
    if not pool_id:
        return []
    try:
        return pool_problems(client, pool_id, cancel_hint)
    except HttpResponseError as err:
        if err.status_code not in (401, 403):
            raise
        return [f"pool {pool_id}: not readable with this credential ({err.status_code})"]


def status(
    client: Any, outputs: dict[str, Any], out: TextIO, cancel_hint: str = "cancel the job"
) -> int:
    job_id = outputs["job_id"]
    job = client.get_job(job_id)
    task = client.get_task(job_id, TASK_ID)
    info = task.execution_info
    lines = [
        f"job         {job_id}: {state_text(job.state)}",
        f"task        {TASK_ID}: {state_text(task.state)}",
    ]
    if info is not None:
        lines.append(
            f"            retries {info.retry_count}, exit code "
            f"{info.exit_code if info.exit_code is not None else '-'}"
        )
        if info.failure_info is not None:
            lines.append(f"            failure: {info.failure_info.message}")
    if state_text(task.state) != "completed":
        lines += [f"pool        {line}" for line in pool_lines(client, job, cancel_hint)]
    for label, key in (
        ("portal", "job_portal_url"),
        ("logs", "job_log_url"),
        ("checkpoints", "job_checkpoint_path"),
        ("metrics", "metrics_url"),
        ("results", "outputs_url"),
        ("image", "image_ref"),
    ):
        if outputs.get(key):
            lines.append(f"{label:<12}{outputs[key]}")
    out.write("\n".join(lines) + "\n")
    return 0


@dataclass
class _LogFile:
    """One instance's file of the running task, read from ``offset`` on."""

    label: str  # the node it is on ("" when the task runs on one node)
    size: Callable[[], Any]  # its properties (content_length)
    read: Callable[[str], Any]  # ocp_range -> chunks
    offset: int = 0
    partial: bytes = b""  # a line not finished yet


def _task_log_files(
    client: Any, job_id: str, task: Any, file_name: str, files: dict[str, _LogFile]
) -> list[_LogFile]:
    """The task's file on every node it runs on, keyed (and kept across polls, with their
    offsets) by node and path. The primary's files are the task's files; a subtask's are in
    its ``taskRootDirectory`` on its node, read with the node file API (articles/batch/
    batch-mpi.md, "Obtain information about subtasks": List Subtasks, which leaves out the
    primary, then Get Node File)."""
    settings = task.multi_instance_settings
    several = settings is not None and (settings.number_of_instances or 1) > 1
    node = task.node_info.node_id if task.node_info is not None else "primary"
    where = [
        (
            f"task:{file_name}",
            node,
            lambda: client.get_task_file_properties(job_id, TASK_ID, file_name),
            lambda span: client.download_task_file(job_id, TASK_ID, file_name, ocp_range=span),
        )
    ]
    if several:
        for sub in client.list_subtasks(job_id, TASK_ID):
            info = sub.node_info
            if info is None or not info.task_root_directory:
                continue  # not scheduled yet
            path = f"{info.task_root_directory.rstrip('/')}/{file_name}"
            where.append(
                (
                    f"{info.pool_id}/{info.node_id}:{path}",
                    info.node_id,
                    functools.partial(
                        client.get_node_file_properties, info.pool_id, info.node_id, path
                    ),
                    functools.partial(_node_range, client, info.pool_id, info.node_id, path),
                )
            )
    for key, label, size, read in where:
        log = files.setdefault(key, _LogFile("", size, read))
        # The primary's node is known once the task is scheduled.
        log.label, log.size, log.read = (label if several else ""), size, read
    return [files[key] for key, *_ in where]


def _node_range(client: Any, pool_id: str, node_id: str, path: str, span: str) -> Any:
    return client.download_node_file(pool_id, node_id, path, ocp_range=span)


def _readable_size(log: _LogFile) -> int | None:
    """The file's size now; None while it cannot be read yet: 404 before its command wrote it,
    409 OperationInvalidForCurrentState before the task has a node (the properties call is a
    HEAD, so the answer has no error body to tell the two 409s apart; "Batch Status and Error
    Codes"; Azure/batch-shipyard convoy/batch.py waits both out the same way)."""
    from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

    try:
        return int(log.size().content_length)
    except ResourceNotFoundError:
        return None
    except HttpResponseError as err:
        if err.status_code == 409:
            return None
        raise


def _emit(log: _LogFile, data: bytes, out: TextIO, final: bool = False) -> None:
    """Whole lines of ``data``, each with its node's label when the task runs on several."""
    text = log.partial + data
    *lines, log.partial = text.split(b"\n")
    if final and log.partial:
        lines, log.partial = [*lines, log.partial], b""
    prefix = f"[{log.label}] " if log.label else ""
    for line in lines:
        out.write(prefix + line.decode("utf-8", errors="replace") + "\n")


def _read_new(log: _LogFile, out: TextIO) -> bool:
    """Print what ``log`` gained since the last read, asking Batch for those bytes only
    (``ocp-range: bytes=first-last``, answered 200 with that part; Tasks - Get Task File).
    True when it read something."""
    size = _readable_size(log)
    if size is None:
        return False
    if size < log.offset:  # a new file (the task was retried): start it from its first byte
        log.offset, log.partial = 0, b""
    if size == log.offset:
        return False
    data = b"".join(log.read(f"bytes={log.offset}-{size - 1}"))
    log.offset += len(data)
    _emit(log, data, out)
    return bool(data)


def logs(
    client: Any,
    outputs: dict[str, Any],
    out: TextIO,
    *,
    file_name: str = "stdout.txt",
    follow: bool = True,
    poll_seconds: float = POLL_SECONDS,
) -> int:
    """Print the task's ``file_name`` on every node it runs on as it grows; then (``follow``,
    like ``tail -f``) poll for new bytes until the task has completed. Batch uploads the files
    to the logs container only when the task ends (``upload_condition`` taskcompletion in
    infra/batch.py); while it runs they are read from the nodes through the Batch file API."""
    job_id = outputs["job_id"]
    files: dict[str, _LogFile] = {}
    waiting_said = False
    while True:
        task = client.get_task(job_id, TASK_ID)
        state = state_text(task.state)
        current = _task_log_files(client, job_id, task, file_name, files)
        read = [_read_new(log, out) for log in current]
        out.flush()
        nothing_yet = all(log.offset == 0 for log in files.values())
        if nothing_yet and not waiting_said and state != "completed":
            out.write(f"waiting for task {TASK_ID} to start (state: {state})\n")
            waiting_said = True
        if state == "completed" or not follow:
            if state == "completed" and any(read):
                continue  # the last bytes may have landed after this read: once more
            for log in files.values():
                _emit(log, b"", out, final=True)
            out.flush()
            return 0
        time.sleep(poll_seconds)


def cancel(client: Any, outputs: dict[str, Any], out: TextIO) -> int:
    job_id = outputs["job_id"]
    terminate_job(client, job_id)
    out.write(
        f"job {job_id} terminated; its checkpoints stay in {outputs.get('job_checkpoint_path')}. "
        "Run `pulumi up --replace` on the job to start it again\n"
    )
    return 0


# ---------------------------------------------------------------------- uploaded metrics
def _number(record: dict[str, Any], key: str, spec: str) -> str:
    value = number(record, key)
    return "-" if value is None else format(value, spec)


def _mean_rate(records: list[dict[str, Any]], key: str) -> float | None:
    rates = [v for r in records if (v := number(r, key)) is not None]
    return sum(rates) / len(rates) if rates else None


def _table(rows: list[tuple[str, ...]], right: set[int]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _uploaded(when: datetime | None) -> str:
    if when is None:
        return ""
    age = max(0, int((datetime.now(UTC) - when).total_seconds()))
    return f", uploaded {when:%Y-%m-%d %H:%M:%S} UTC ({age // 60} min {age % 60} s ago)"


def metrics(
    container: Any, folder: BlobFolder, job: Job, out: TextIO, *, last: int = LAST_STEPS
) -> int:
    """The last ``last`` logged training steps and their mean throughput."""
    records, when = read_metrics(container, folder)
    train = train_records(records)
    out.write(f"job {job.name} ({job.job_id}): {folder.url}{METRICS_FILE}{_uploaded(when)}\n")
    if not train:
        out.write("no training steps logged yet\n")
        return 0
    shown = train[-last:]
    unit, key = rate_key(shown)  # tokens for a language model's run, images otherwise
    rows = [("step", "epoch", "loss", f"{unit}/s")]
    rows += [
        (
            str(r["step"]),
            _number(r, "epoch", "g"),
            _number(r, "loss", ".4f"),
            _number(r, key, ".1f"),
        )
        for r in shown
    ]
    out.write(_table(rows, right={0, 1, 2, 3}))
    recent, overall = _mean_rate(shown, key), _mean_rate(train, key)
    if recent is not None and overall is not None:
        out.write(
            f"throughput: {recent:.1f} {unit}/s total, mean of the last {len(shown)} logged "
            f"steps ({overall:.1f} over all {len(train)} in the file)\n"
        )
    evals = [r for r in records if r.get("kind") == "eval"]  # trainer.run's val_* records
    if evals:
        e = evals[-1]
        out.write(
            f"last evaluation: step {e.get('step')}, epoch {e.get('epoch')}, loss "
            f"{_number(e, 'val_loss', '.4f')}, accuracy {_number(e, 'val_accuracy', '.4f')}\n"
        )
    # --noise-scale-every: the latest smoothed estimate, as the run's own summary says it.
    if (noise := noise_advice(records)) is not None:
        out.write(noise + "\n")
    return 0


def list_jobs(
    client: Any,
    outputs: dict[str, Any],
    stack: str,
    out: TextIO,
    err: TextIO,
    *,
    container_for: Callable[[BlobFolder], Any] = blob_container,
) -> int:
    """One row per job: Batch's live state, and the step and rate rank 0 uploaded last."""
    from azure.core.exceptions import ResourceNotFoundError

    rows = [("NAME", "JOB ID", "JOB", "TASK", "NODES", "RETRIES", "STEP", "THROUGHPUT")]
    notes = []
    for job in stack_jobs(outputs, stack):
        task_state, retries, nodes = "-", "-", job.outputs.get("node_count")
        try:
            job_state = state_text(client.get_job(job.job_id).state)
        except ResourceNotFoundError:
            job_state = "not found"
        if job_state != "not found":
            try:
                task = client.get_task(job.job_id, TASK_ID)
            except ResourceNotFoundError:
                task = None
            if task is not None:
                task_state = state_text(task.state)
                if task.execution_info is not None:
                    retries = str(task.execution_info.retry_count)
                if nodes is None and task.multi_instance_settings is not None:
                    nodes = task.multi_instance_settings.number_of_instances
        step, rate = "-", "-"
        if job.metrics is not None:
            try:
                latest = latest_step(container_for(job.metrics), job.metrics)
                if latest is not None:
                    step = str(latest[0])
                    rate = "-" if latest[1] is None else f"{latest[1]:.1f} {latest[2]}/s"
            except NotUploaded:
                pass
            except StorageError as error:
                notes.append(f"job {job.name}: metrics: {error}")
                step, rate = _recorded_progress(job.outputs)
        row = (job.name, job.job_id, job_state, task_state, str(nodes or "-"), retries, step, rate)
        rows.append(row)
    out.write(_table(rows, right={4, 5, 6, 7}))
    for note in notes:
        err.write(f"note: {note}\n")
    return 0


def _recorded_progress(outputs: dict[str, Any]) -> tuple[str, str]:
    """The step and rate the stack's last refresh recorded, marked with when they were
    uploaded (``progress_at``); ("-", "-") without them."""
    step, at = outputs.get("step"), outputs.get("progress_at")
    if step is None or not at:
        return "-", "-"
    unit = next((u for u in ("images", "tokens") if outputs.get(f"{u}_per_sec")), None)
    rate = "-" if unit is None else f"{outputs[f'{unit}_per_sec']:.1f} {unit}/s"
    return f"{step} (as of {at})", rate


# ---------------------------------------------------------------------- TensorBoard
def sync_tensorboard(container: Any, folder: BlobFolder, dest: Path) -> tuple[int, int]:
    """Copy the uploaded TensorBoard files into ``dest``: (copied, already there). Event files
    only grow, so a local file of the blob's size is that blob; each copy lands whole (a temp
    file renamed), so a running TensorBoard never reads half a file."""
    prefix = folder.blob(TENSORBOARD_FOLDER)
    url = folder.url + TENSORBOARD_FOLDER
    with storage_errors(url):
        blobs = list(container.list_blobs(name_starts_with=prefix))
    if not blobs:
        raise NotUploaded(
            f"{url}: no TensorBoard files uploaded yet (rank 0 uploads every "
            "--metrics-upload-minutes once training runs)"
        )
    copied = kept = 0
    for blob in blobs:
        relative = PurePosixPath(blob.name[len(prefix) :])
        if not relative.parts or any(part in ("", ".", "..") for part in relative.parts):
            continue  # a name that would leave dest
        target = dest.joinpath(*relative.parts)
        if target.is_file() and target.stat().st_size == blob.size:
            kept += 1
            continue
        with storage_errors(f"{folder.url}{relative}"):
            data = container.download_blob(blob.name).readall()
        target.parent.mkdir(parents=True, exist_ok=True)
        # Not write_atomic's ".<name>.partial-*": TensorBoard reads every file whose name holds
        # "tfevents", temp files included (IsSummaryEventsFile, event_processing/io_wrapper.py).
        temp = target.with_name(f".sync-{os.getpid()}.partial")
        try:
            temp.write_bytes(data)
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        copied += 1
    return copied, kept


def tensorboard_command(logdir: Path, port: int) -> list[str]:
    """TensorBoard of this environment, through dt_commands.tensorboard_cli (see there why)."""
    return [
        sys.executable,
        "-m",
        "dt_commands.tensorboard_cli",
        "--logdir",
        str(logdir),
        "--port",
        str(port),
    ]


def start_tensorboard(command: list[str], **popen: Any) -> subprocess.Popen[Any]:
    # The repository root on the path, so ``-m dt_commands.tensorboard_cli`` imports from anywhere.
    root = str(REPO)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(command, env={**os.environ, "PYTHONPATH": path}, **popen)


def tensorboard(
    container: Any,
    folder: BlobFolder,
    job: Job,
    dest: Path,
    out: TextIO,
    *,
    start: Callable[[list[str]], Any] | None = start_tensorboard,
    port: int = TENSORBOARD_PORT,
    sync_seconds: float = TENSORBOARD_SYNC_SECONDS,
) -> int:
    """Sync the job's TensorBoard files into ``dest``; then (``start``) run TensorBoard on it,
    syncing again every ``sync_seconds`` until it exits."""
    copied, kept = sync_tensorboard(container, folder, dest)
    out.write(
        f"job {job.name} ({job.job_id}): {copied} TensorBoard file(s) copied, {kept} unchanged, "
        f"in {dest}\n"
    )
    out.flush()
    if start is None:
        return 0
    process = start(tensorboard_command(dest, port))
    out.write(f"TensorBoard on port {port}; syncing every {sync_seconds:g} s; Ctrl-C stops it\n")
    out.flush()
    try:
        while True:
            try:
                return process.wait(timeout=sync_seconds)
            except subprocess.TimeoutExpired:
                pass
            try:
                copied, _ = sync_tensorboard(container, folder, dest)
            except StorageError as error:  # keep serving what is there
                out.write(f"warning: {error}\n")
                continue
            if copied:
                out.write(f"synced {copied} new or grown TensorBoard file(s)\n")
            out.flush()
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=30)


def tcp_port(text: str) -> int:
    """An argparse type for a port to listen on: 1..65535 (argparse makes the ValueError one
    line naming the option and the value, exit 2), never a traceback from bind()."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port; give one in 1..65535")
    return int(text)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="dt-jobs", allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("list", "every job of the stack: state, nodes, retries, current step, throughput"),
        ("status", "job and task state, retries, exit code, where logs and checkpoints are"),
        ("logs", "stream the task's stdout on every node while it runs (like tail -f)"),
        ("cancel", "terminate the job (checkpoints are kept)"),
        ("metrics", "the last logged steps and the throughput, from the uploaded metrics"),
        ("tensorboard", "copy the uploaded TensorBoard files to a folder and start TensorBoard"),
        ("fetch", "download the finished run's results, verified against their manifest"),
    ):
        sub = commands.add_parser(name, help=helptext)
        sub.add_argument("--stack", required=True, help="the stack whose jobs to follow")
        sub.add_argument("--outputs-file", type=Path, help="JSON of `pulumi stack output --json`")
        if name != "list":
            sub.add_argument("--job", help="which job of the stack's jobs (needed if several)")
        if name == "logs":
            sub.add_argument("--stderr", action="store_true", help="stream stderr.txt instead")
            sub.add_argument("--no-follow", action="store_true", help="print once and exit")
        if name == "metrics":
            sub.add_argument(
                "--last", type=positive_int, default=LAST_STEPS, help="logged steps to show"
            )
        if name == "tensorboard":
            sub.add_argument(
                "--dir", type=Path, help="local folder (default: runs/<stack>/<job>/tensorboard)"
            )
            sub.add_argument("--no-start", action="store_true", help="copy only")
            sub.add_argument(
                "--port", type=tcp_port, default=TENSORBOARD_PORT, help="TensorBoard's port"
            )
        if name == "fetch":
            sub.add_argument("--to", type=Path, help="local folder (default: results/<job>)")
            sub.add_argument("--force", action="store_true", help="replace a non-empty --to")
        sub.error = parser.error  # type: ignore[method-assign]
    sweep.add_parser(commands).error = parser.error  # type: ignore[method-assign]
    return parser


def _metrics_folder(job: Job, stack: str) -> BlobFolder:
    if job.metrics is None:
        raise OutputsError(
            f"stack={stack}: job {job.name} has no metrics_url (nor job_log_url) output; "
            "is `pulumi up` done with this version?"
        )
    return job.metrics


def main(
    argv: list[str] | None = None,
    client_factory=batch.client,
    start: Callable[[list[str]], Any] = start_tensorboard,
) -> int:
    parser = build_parser()
    # Only a sweep takes more arguments: the trainer flags of its --local runs.
    args, extra = parser.parse_known_args(argv)
    if args.command == "sweep":
        return sweep.run(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from azure.core.exceptions import AzureError

    where = f"stack={args.stack}"
    try:
        outputs = read_outputs(args.stack, args.outputs_file)
        if args.command == "list":
            client = client_factory(require(outputs, "batch_account_endpoint", args.stack))
            return list_jobs(client, outputs, args.stack, sys.stdout, sys.stderr)
        job = select_job(outputs, args.stack, args.job)
        where = f"job {job.job_id}"
        if args.command == "metrics":
            folder = _metrics_folder(job, args.stack)
            return metrics(blob_container(folder), folder, job, sys.stdout, last=args.last)
        if args.command == "tensorboard":
            folder = _metrics_folder(job, args.stack)
            dest = args.dir or Path("runs", args.stack, job.name, "tensorboard")
            return tensorboard(
                blob_container(folder),
                folder,
                job,
                dest,
                sys.stdout,
                start=None if args.no_start else start,
                port=args.port,
            )
        if args.command == "fetch":
            return fetch_job(job, args.stack, args.to, args.force, sys.stdout)
        client = client_factory(require(outputs, "batch_account_endpoint", args.stack))
        if args.command == "status":
            hint = f"cancel the job (dt-jobs cancel --stack {args.stack} --job {job.name})"
            return status(client, job.outputs, sys.stdout, hint)
        if args.command == "logs":
            name = "stderr.txt" if args.stderr else "stdout.txt"
            return logs(client, job.outputs, sys.stdout, file_name=name, follow=not args.no_follow)
        return cancel(client, job.outputs, sys.stdout)
    except JobsError as err:
        message = str(err)
        where = f"outputs_file={args.outputs_file}"
        if isinstance(err, OutputsError) and args.outputs_file and not message.startswith(where):
            # The outputs came from the file: name it with what is wrong in it.
            message = f"{where}: {message.removeprefix(f'stack={args.stack}: ')}"
        fail(message, err.code)
    except StorageError as err:
        fail(str(err), err.code)
    except AzureError as err:
        fail(f"{where}: {str(err).splitlines()[0]}", 1)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
