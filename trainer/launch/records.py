"""A run's records in ``<run-dir>/logs`` on the shared file system: each attempt's launcher logs
(``RunLog``) and outcomes, the current attempt (``RunRecords``), and the primary's ``--report``
over them. Why the launchers record rather than exit with their code: docs/deploy.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from trainer.common.files import ensure_writable_folder, write_atomic
from trainer.launch.batch_env import LaunchError, host_list
from trainer.launch.rendezvous import publish_token, read_token
from trainer.launch.store import POLL_SECONDS

# The report's exit code when the workers were stopped by a signal (and checkpointed): the run
# is not finished, so the task must not count as succeeded (Batch retries it, which resumes).
INTERRUPTED_EXIT = 75
# How long a file another node wrote may stay invisible to this one on the shared file system:
# the NFS client trusts cached lookups, negative ones too, until the folder's cached attributes
# expire, at most acdirmax, 60 s by default (nfs(5), "Directory entry caching", lookupcache=all);
# the pools mount with none of ac/actimeo/acdirmax/lookupcache set (infra/nfs.py), so a reader
# opens such a file by name again until this passed (the lookup then reaches the server).
NFS_CACHE_SECONDS = 60

# A failed attempt's summary ends with what an operator can do about the node it names, unless a
# node failed its own checks and keeps itself out (trainer.launch.recheck); the nodes hold
# no right over their pool (docs/jobs.md, A node that fails).
KEEP_OUT_HINT = "to keep a sick node out of the next tries: dt-jobs keep-out --stack NAME NODE_ID"

_T = TypeVar("_T")


@dataclass(frozen=True)
class Outcome:
    """How this node's part of the run ended, as recorded for the report."""

    code: int
    reason: str
    interrupted: bool = False
    kept_out: str = ""  # why this node keeps itself out of the pool (trainer.launch.recheck)


class RunLog:
    """Everything this launcher prints: to its own stdout/stderr (the task's output files) and,
    once the attempt is known, into the run folder on the shared file system, where the
    primary's ``--report`` finds the logs of every node."""

    def __init__(self, name: str, *, keep_early: bool) -> None:
        self.name = name
        # Reentrant: the SIGTERM handler logs from the main thread, which may hold it already.
        self._lock = threading.RLock()
        self._file: IO[str] | None = None
        self._early: list[str] | None = [] if keep_early else None

    def open(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        file = open(path, "a", encoding="utf-8")  # noqa: SIM115  # closed by close()
        with self._lock:
            file.write("".join(self._early or []))
            file.flush()
            self._file, self._early = file, None

    def write(self, text: str, stream: IO[str]) -> None:
        with self._lock:
            stream.write(text)
            stream.flush()
            if self._file is not None:
                with contextlib.suppress(OSError):  # a full share must not stop training
                    self._file.write(text)
                    self._file.flush()
            elif self._early is not None:
                self._early.append(text)

    def say(self, message: str) -> None:
        self.write(f"[launch {self.name}] {message}\n", sys.stderr)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None


def check_writable(folder: Path) -> None:
    """Fail before any worker starts when the run folder cannot be created or written: on
    Batch the task runs as a non-admin user, which an NFS export owned by root refuses."""
    try:
        ensure_writable_folder(folder)
    except OSError as err:
        raise LaunchError(
            f"output_dir={folder}: cannot create or write it as uid {os.getuid()} "
            f"({err.strerror or err}): make the runs folder on the share writable for the "
            "task's user (e.g. chmod 1777 on the export's runs/ folder), or pass another "
            "--run-dir (and the same --output-dir to the workers)"
        ) from None


class RunRecords:
    """``<run-dir>/logs``: each attempt's launcher logs and outcomes, and which attempt is
    the current one."""

    def __init__(self, run_dir: Path) -> None:
        self.root = run_dir / "logs"
        self.current = self.root / "current.json"
        # The master's token for the other nodes: the run folder is on the file system every
        # node of the pool mounts, which a host elsewhere on the VNet cannot read.
        self.token = self.root / "rendezvous.token"

    def publish_token(self, token: str) -> None:
        publish_token(self.token, token)  # readable by the other nodes' uids (rendezvous.py)

    def read_token(self) -> str | None:
        """The token the master published, None until it did (or while it cannot be read)."""
        return read_token(self.token)

    @staticmethod
    def new_attempt() -> str:
        return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)

    def log_path(self, attempt: str, host: str) -> Path:
        return self.root / attempt / f"launch-{host}.log"

    def outcome_path(self, attempt: str, host: str) -> Path:
        return self.root / attempt / f"outcome-{host}.json"

    def start(self, attempt: str, hosts: list[str], env: dict[str, str]) -> None:
        (self.root / attempt).mkdir(parents=True, exist_ok=True)
        record = {"attempt": attempt, "hosts": hosts, "job": env.get("AZ_BATCH_JOB_ID")}
        write_atomic(self.current, json.dumps(record).encode())

    def finish(self, attempt: str, host: str, outcome: Outcome) -> None:
        record = {"attempt": attempt, "host": host, **asdict(outcome)}
        write_atomic(self.outcome_path(attempt, host), json.dumps(record).encode())

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise LaunchError(f"{path}: cannot read it ({err})") from None

    @staticmethod
    def _log(path: Path) -> str | None:
        """A node's log, None while this node cannot see it; an error's message in its place."""
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except OSError as err:
            return f"(no log: {err.strerror})\n"

    def report(
        self,
        env: dict[str, str],
        out: IO[str],
        wait: float = NFS_CACHE_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> int:
        """Print every node's log of the current attempt; the exit code of its outcome. The
        other nodes wrote their logs and outcomes, which this node may not see yet
        (``NFS_CACHE_SECONDS``): each is opened by name again until it is there or ``wait``
        seconds passed, so a node whose launcher died costs the report that long."""
        current = self._read(self.current)
        if current is None:
            raise LaunchError(
                f"{self.current} is missing: no launcher recorded a run in {self.root} "
                "(the coordination command must run trainer.launch; see each node's output)"
            )
        attempt, hosts = current["attempt"], current["hosts"]
        # Defence in depth: Batch runs this only after this attempt's master rewrote the file.
        expected = {"hosts": host_list(env), "job": env.get("AZ_BATCH_JOB_ID")}
        for key, value in expected.items():
            if value and current.get(key) != value:
                raise LaunchError(
                    f"{self.current}: records {key} {current.get(key)}, not this task's "
                    f"{value}: a stale record; run the task again"
                )
        failures: list[tuple[int, str]] = []
        kept_out: list[str] = []
        interrupted = False
        deadline = time.monotonic() + wait
        for index, host in enumerate(hosts):
            log_path = self.log_path(attempt, host)
            out.write(f"===== node {index + 1}/{len(hosts)} {host}: {log_path} =====\n")
            outcome_path = self.outcome_path(attempt, host)
            outcome = _until_seen(lambda p=outcome_path: self._read(p), deadline, sleep)
            text = _until_seen(lambda p=log_path: self._log(p), deadline, sleep)
            out.write("(no log: No such file or directory)\n" if text is None else text)
            if outcome is None or outcome.get("attempt") != attempt:
                failures.append((1, f"node {host} recorded no outcome (its launcher died?)"))
            elif outcome["code"] != 0:
                failures.append((int(outcome["code"]), outcome["reason"]))
            interrupted = interrupted or bool(outcome and outcome.get("interrupted"))
            if outcome and outcome.get("attempt") == attempt and outcome.get("kept_out"):
                kept_out.append(outcome["kept_out"])
        code, summary = _summary(attempt, failures, kept_out, interrupted)
        out.write(f"===== {summary}\n")  # the last line: dt-jobs status finds it by its mark
        out.flush()
        return code


def _summary(
    attempt: str, failures: list[tuple[int, str]], kept_out: list[str], interrupted: bool
) -> tuple[int, str]:
    """The attempt's exit code and its report's last line."""
    if failures:
        code, reason = failures[0]
        # A node that keeps itself out (and did not restart in time: trainer.launch.recheck)
        # is named once, whether or not its own failure is the first.
        hint = "; ".join(k for k in kept_out if k not in reason) if kept_out else KEEP_OUT_HINT
        hint = f"; {hint}" if hint else ""
        return code, f"attempt {attempt} failed: {reason} (exit {code}){hint}"
    if interrupted:
        return INTERRUPTED_EXIT, f"attempt {attempt} was stopped by a signal"
    return 0, f"attempt {attempt}: every node finished"


def _until_seen(
    read: Callable[[], _T | None], deadline: float, sleep: Callable[[float], None]
) -> _T | None:
    """What ``read`` returns once it is not None, or None at ``deadline`` (``time.monotonic``)."""
    while (found := read()) is None and time.monotonic() < deadline:
        sleep(POLL_SECONDS)
    return found
