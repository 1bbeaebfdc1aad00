"""The launcher's side of a node check after a failed try (trainer/launch/recheck.py) against
a watcher that behaves as infra/node_checks.py's does: it removes the request within a second
and answers by replacing the verdict file."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from trainer.common.files import write_atomic
from trainer.launch import recheck
from trainer.launch.recheck import (
    REQUEST,
    VERDICT,
    VERDICT_SECONDS,
    check_node,
    wait_for_restart,
)


def watcher(task_dir: Path, answer: str, stop: threading.Event) -> threading.Thread:
    """Takes each request in ``task_dir`` and answers it."""

    def loop() -> None:
        while not stop.wait(0.05):
            request = task_dir / REQUEST
            if request.exists():
                request.unlink()
                staged = task_dir / ".answer"
                staged.write_text(answer + "\n")
                staged.replace(task_dir / VERDICT)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def ask(tmp_path: Path, answer: str) -> tuple[str | None, list[str]]:
    """The launcher's question to a watcher that answers: however late a busy machine lets the
    watcher's thread run, the launcher waits for it (up to the verdict's own limit)."""
    said: list[str] = []
    stop = threading.Event()
    watcher(tmp_path, answer, stop)
    try:
        return check_node(tmp_path, said.append, poll=0.02, taken=VERDICT_SECONDS), said
    finally:
        stop.set()


def test_a_healthy_node_goes_on_and_says_so(tmp_path):
    (tmp_path / VERDICT).write_text("sick an earlier try's verdict\n")  # never read as this one
    result, said = ask(tmp_path, "ok")
    assert result is None and said[-1] == "the node passed its checks"


def test_a_sick_node_returns_the_watchers_reason(tmp_path):
    result, _ = ask(tmp_path, "sick GPU 3: 2 uncorrectable ECC errors since boot")
    assert result == "GPU 3: 2 uncorrectable ECC errors since boot"


def test_a_node_that_cannot_record_its_failure_stays_and_says_how_to_keep_it_out(tmp_path):
    result, said = ask(tmp_path, "unrecorded a file system failed since boot: EXT4-fs (sda1)")
    assert result is None
    assert said[-1] == (
        "the node failed its checks (a file system failed since boot: EXT4-fs (sda1)) but cannot "
        "record it, so it cannot keep itself out: `dt-jobs keep-out` it"
    )


def test_waiting_for_the_restart_takes_the_verdict_and_outlasts_a_sigterm(tmp_path):
    """The watcher restarts the node once the verdict is gone; the SIGTERM that comes first
    (Docker's and systemd's stop) must not end the task before the VM goes."""
    (tmp_path / VERDICT).write_text("sick GPU 3\n")
    said: list[str] = []

    def say_then_stop(line: str) -> None:  # the stop comes while it waits, however busy the machine
        said.append(line)
        if line == "waiting for this node to restart":
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    try:
        wait_for_restart(tmp_path, say_then_stop, seconds=0.5)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not (tmp_path / VERDICT).exists()
    assert said == ["waiting for this node to restart",
                    "the node did not restart within 0.5 s: exiting"]  # fmt: skip


def test_without_a_watcher_the_request_is_withdrawn_after_a_few_seconds(tmp_path):
    """The line is said only by the withdrawal, never by the verdict's timeout (75 s here)."""
    said: list[str] = []
    assert check_node(tmp_path, said.append, taken=0.3, poll=0.02) is None
    assert not (tmp_path / REQUEST).exists()
    assert said[-1] == "no node watcher took the request: the node is not checked"


def test_a_verdict_that_never_comes_ends_the_wait(tmp_path, monkeypatch):
    """The watcher takes the request the moment it is written (a thread might not be scheduled
    before ``taken`` on a busy machine, and the launcher would rightly say no watcher took it)
    and never answers."""
    written: list[Path] = []

    def taken_at_once(path: Path, data: bytes) -> None:
        write_atomic(path, data)
        path.unlink()
        written.append(path)

    monkeypatch.setattr(recheck, "write_atomic", taken_at_once)
    said: list[str] = []
    assert check_node(tmp_path, said.append, timeout=0.5, taken=0.3, poll=0.02) is None
    assert written == [tmp_path / REQUEST]
    assert said[-1] == "no node check verdict within 0.5 s: going on without one"


def test_outside_batch_nothing_is_asked(tmp_path):
    said: list[str] = []
    assert check_node(None, said.append) is None and said == []
