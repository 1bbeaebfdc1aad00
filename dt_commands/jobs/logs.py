"""``dt-jobs logs``: the task's stdout (or stderr) on every node it runs on, as it grows, read
through the Batch file API while it runs (like ``tail -f``); Batch uploads the files to the logs
container only when the task ends."""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from dt_commands.jobs.call import Call
from infra.batch import TASK_ID, state_text

NAME = "logs"
HELP = "stream the task's stdout on every node while it runs (like tail -f)"
POLL_SECONDS = 5.0


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--stderr", action="store_true", help="stream stderr.txt instead")
    sub.add_argument("--no-follow", action="store_true", help="print once and exit")


def run(call: Call) -> int:
    job = call.job()
    name = "stderr.txt" if call.args.stderr else "stdout.txt"
    return logs(
        call.client(), job.outputs, call.out, file_name=name, follow=not call.args.no_follow
    )


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
    offsets) by node and path. The primary's files are the task's files (its coordination
    output's own, if Batch keeps it apart: ``_coordination_files``); a subtask's are in its
    ``taskRootDirectory`` on its node, read with the node file API (articles/batch/
    batch-mpi.md, "Obtain information about subtasks": List Subtasks, which leaves out the
    primary, then Get Node File)."""
    settings = task.multi_instance_settings
    several = settings is not None and (settings.number_of_instances or 1) > 1
    node = task.node_info.node_id if task.node_info is not None else "primary"
    names = _coordination_files(client, job_id, file_name) if settings is not None else []
    where = [
        (
            f"task:{name}",
            node,
            functools.partial(client.get_task_file_properties, job_id, TASK_ID, name),
            functools.partial(_task_range, client, job_id, name),
        )
        for name in [*names, file_name]
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


def _coordination_files(client: Any, job_id: str, file_name: str) -> list[str]:
    """The primary's other files of the stream ``file_name`` (``stdout.txt``: any ``*.txt``
    in its task folder whose name holds ``stdout``). Where Batch writes the primary's
    coordination output is not documented (read 2026-11-28: articles/batch/batch-mpi.md, the
    REST reference's MultiInstanceSettings and Task - List Task Files are silent; subtasks'
    are their stdout.txt/stderr.txt): in the task's stdout.txt before the application's, or
    in files of its own (docs/fake-readings.md). Listing the task folder (Task - List Task
    Files, one level) finds them under either; none before the task has a node (409)."""
    from trainer.common.azure_sdk import HttpResponseError, ResourceNotFoundError

    stem = file_name.rsplit(".", 1)[0]
    try:
        listed = [f.name for f in client.list_task_files(job_id, TASK_ID, recursive=False)]
    except ResourceNotFoundError:
        return []
    except HttpResponseError as err:
        if err.status_code == 409:
            return []
        raise
    return sorted(
        name
        for name in listed
        if name and name != file_name and name.endswith(".txt") and stem in name
    )


def _task_range(client: Any, job_id: str, name: str, span: str) -> Any:
    return client.download_task_file(job_id, TASK_ID, name, ocp_range=span)


def _node_range(client: Any, pool_id: str, node_id: str, path: str, span: str) -> Any:
    return client.download_node_file(pool_id, node_id, path, ocp_range=span)


def _readable_size(log: _LogFile) -> int | None:
    """The file's size now; None while it cannot be read yet: 404 before its command wrote it,
    409 OperationInvalidForCurrentState before the task has a node (the properties call is a
    HEAD, so the answer has no error body to tell the two 409s apart; "Batch Status and Error
    Codes"; Azure/batch-shipyard convoy/batch.py waits both out the same way)."""
    from trainer.common.azure_sdk import HttpResponseError, ResourceNotFoundError

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
