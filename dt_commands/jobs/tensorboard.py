"""``dt-jobs tensorboard``: copy the TensorBoard files the job's rank 0 uploads into a local
folder, then run TensorBoard on it (``tensorboard_cli``), syncing again until it exits."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, TextIO

from dt_commands.jobs.call import Call
from dt_commands.stack_outputs import Job
from infra.image_inputs import REPO
from infra.live_metrics import NotUploaded, StorageError, blob_container, storage_errors
from trainer.common.blob_folder import BlobFolder

NAME = "tensorboard"
HELP = "copy the uploaded TensorBoard files to a folder and start TensorBoard"
TENSORBOARD_FOLDER = "tensorboard/"
TENSORBOARD_SYNC_SECONDS = 60.0
TENSORBOARD_PORT = 6006  # TensorBoard's own default


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--dir", type=Path, help="local folder (default: runs/<stack>/<job>/tensorboard)"
    )
    sub.add_argument("--no-start", action="store_true", help="copy only")
    sub.add_argument("--port", type=tcp_port, default=TENSORBOARD_PORT, help="TensorBoard's port")


def run(call: Call) -> int:
    job = call.job()
    folder = call.metrics_folder(job)
    dest = call.args.dir or Path("runs", call.stack, job.name, "tensorboard")
    start = None if call.args.no_start else call.start
    container = blob_container(folder)
    return tensorboard(container, folder, job, dest, call.out, start=start, port=call.args.port)


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
    """TensorBoard of this environment, through dt_commands.jobs.tensorboard_cli (see there why)."""
    return [
        sys.executable,
        "-m",
        "dt_commands.jobs.tensorboard_cli",
        "--logdir",
        str(logdir),
        "--port",
        str(port),
    ]


def start_tensorboard(command: list[str], **popen: Any) -> subprocess.Popen[Any]:
    # The repository root on the path, so ``-m dt_commands.jobs.tensorboard_cli`` imports from
    # anywhere.
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
