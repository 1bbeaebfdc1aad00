"""A process tree the emulator started on a node: a task's (or a unit's) PID namespace whose
PID 1 is the agent (``agent.py run``), which reports the command's exit on a pipe; what a
terminate signals and kills in it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from pathlib import Path


class ClusterClosed(RuntimeError):
    """A process asked for after the cluster closed (see ``Cluster._register``)."""


class Proc:
    """A task's process tree in its own PID namespace (PID 1 is the agent)."""

    def __init__(self, popen: subprocess.Popen[bytes], status_fd: int, name: str) -> None:
        self.popen, self.name = popen, name
        self.code: int | None = None
        self.error: str | None = None
        self.done = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(status_fd,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            line = pipe.readline()
        if line:
            status = json.loads(line)
            self.code, self.error = status["exit"], status.get("error")
        else:  # the agent died before reporting (killed with its namespace)
            self.code = self.popen.wait()
            self.code = 128 - self.code if self.code < 0 else self.code
        self.done.set()

    def wait(self, timeout: float | None = None) -> int | None:
        self.done.wait(timeout)
        return self.code

    def init_pid(self) -> int | None:
        """The tree's PID 1 as this machine numbers it: the child of ``unshare``."""
        parent = str(self.popen.pid)
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if fields[1] == parent:
                    return int(entry)
        return None

    def pids(self) -> list[int]:
        """Every process of the tree except its PID 1 (the container's processes)."""
        init = self.init_pid()
        if init is None:
            return []
        try:
            namespace = os.readlink(f"/proc/{init}/ns/pid")
        except OSError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == init:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    found.append(int(entry))
        return found

    def main_pid(self) -> int | None:
        """The container's first process (what Docker starts and `docker stop` signals): the
        agent's oldest child; processes orphaned later are reparented to the agent too."""
        init = self.init_pid()
        if init is None:
            return None
        children = []
        for pid in self.pids():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == init:
                    children.append((int(fields[19]), pid))  # starttime, pid
        return min(children)[1] if children else None

    def stop_signal(self, signum: int) -> str:
        """``signum`` to the container's first process only, as `docker stop` sends it. That
        process is PID 1 of the container's PID namespace, and "a process running as PID 1
        inside a container ... ignores any signal with the default action" (docs.docker.com,
        docker run reference, --init; the kernel drops a signal to a namespace's init that has
        no handler for it). Here the agent is the namespace's init, so the rule is applied by
        hand: the signal is dropped unless the first process catches it. What happened, for
        the log."""
        pid = self.main_pid()
        if pid is None:
            return "no process"
        caught = 0
        with contextlib.suppress(OSError, StopIteration, ValueError):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            caught = int(next(line for line in status if line.startswith("SigCgt:")).split()[1], 16)
        if not caught & (1 << (signum - 1)):
            return f"dropped: PID 1 ({pid}) has no handler for signal {signum}"
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        return f"sent to PID 1 ({pid})"

    def kill(self) -> None:
        """The container is removed: its PID 1 dies and the kernel kills the rest. Killed by
        its process group (unshare and the agent it forked, the namespace's PID 1): unshare's
        --kill-child alone misses an agent killed before it set its parent-death signal, which
        then outlived its cluster."""
        # The group outlives its leader while the agent lives: killed even when unshare ended.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        self.done.wait(5)
