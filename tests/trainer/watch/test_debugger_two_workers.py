"""--debug-rank on two real DDP workers (torchrun): a Debug Adapter Protocol client attaches to
rank 1 over TCP as an IDE would, stops it at a breakpoint, and lets the run finish. The same
run profiles two steps (--profile-steps), so its traces are checked here too."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.launchers import small_config, torchrun
from tests.support.ports import free_port
from tests.trainer.traces import recorded_steps
from trainer.settings.flags import to_flags

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


class DapClient:
    """The client side of the Debug Adapter Protocol: requests out, responses and events in,
    each a JSON body after a ``Content-Length`` header. Messages read while waiting for
    another are kept, since the adapter answers some requests out of order (``attach`` only
    after ``configurationDone``)."""

    def __init__(self, port: int) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port), timeout=60)
        self._file = self._socket.makefile("rb")
        self._seq = 0
        self._backlog: list[dict[str, Any]] = []

    def send(self, command: str, **arguments: Any) -> int:
        self._seq += 1
        body = json.dumps(
            {"seq": self._seq, "type": "request", "command": command, "arguments": arguments}
        ).encode()
        self._socket.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return self._seq

    def _read(self) -> dict[str, Any]:
        headers = {}
        while (line := self._file.readline()) not in (b"\r\n", b""):
            name, value = line.decode("ascii").split(":", 1)
            headers[name.strip().lower()] = value.strip()
        assert headers, "the adapter closed the connection"
        return json.loads(self._file.read(int(headers["content-length"])))

    def _next(self, wanted: Any) -> dict[str, Any]:
        for message in self._backlog:
            if wanted(message):
                self._backlog.remove(message)
                return message
        while not wanted(message := self._read()):
            self._backlog.append(message)
        return message

    def response(self, seq: int) -> dict[str, Any]:
        reply = self._next(lambda m: m["type"] == "response" and m["request_seq"] == seq)
        assert reply["success"], reply
        return reply.get("body") or {}

    def request(self, command: str, **arguments: Any) -> dict[str, Any]:
        return self.response(self.send(command, **arguments))

    def event(self, name: str) -> dict[str, Any]:
        return self._next(lambda m: m["type"] == "event" and m["event"] == name).get("body") or {}

    def close(self) -> None:
        self._file.close()
        self._socket.close()


def _wait_for_line(log: Path, pattern: str, launcher: subprocess.Popen[bytes]) -> re.Match[str]:
    deadline = time.monotonic() + 120
    while not (match := re.search(pattern, log.read_text(errors="replace"), re.MULTILINE)):
        assert launcher.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no line matching {pattern!r}: {log.read_text()}"
        time.sleep(0.1)
    return match


def _line_of(path: Path, text: str) -> int:
    lines = path.read_text().splitlines()
    assert sum(text in line for line in lines) == 1, f"{text!r} is not on one line of {path}"
    return next(number for number, line in enumerate(lines, start=1) if text in line)


def test_a_debugger_attaches_to_one_rank_while_the_other_waits(tmp_path, repo):
    out, port = tmp_path / "out", free_port()
    config = small_config(
        out,
        backend="ddp",
        epochs=1,
        max_steps=4,
        log_every=1,
        debug_rank=1,
        debug_port=port,
        profile_steps="2-3",
    )
    log = tmp_path / "run.log"
    with open(log, "w") as log_file:  # a file: an unread pipe could fill up and block
        launcher = subprocess.Popen(
            torchrun("-m", "trainer", *to_flags(config)),
            cwd=repo,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    client = None
    try:
        listening = _wait_for_line(
            log,
            rf"^\[rank 1\] WARNING rank 1 waits for a debugger on host (\S+), port {port} ",
            launcher,
        )
        host = re.escape(listening[1])
        _wait_for_line(
            log,
            rf"^\[rank 0\] WARNING rank 0 waits at a barrier until the debugger on rank 1 "
            rf"\(host {host}, port {port}\) attaches$",
            launcher,
        )

        client = DapClient(port)
        client.request("initialize", clientID="tests", adapterID="debugpy", pathFormat="path")
        attach = client.send("attach", justMyCode=True)
        client.event("initialized")
        # The first step of the epoch loop, on the line that runs each training step.
        loop = repo / "trainer" / "training" / "steps.py"
        line = _line_of(loop, "meter.add(*train_step(parts, group))")
        source = {"path": str(loop)}
        placed = client.request("setBreakpoints", source=source, breakpoints=[{"line": line}])
        assert placed["breakpoints"][0]["verified"], placed
        client.request("configurationDone")
        client.response(attach)

        stopped = client.event("stopped")
        assert stopped["reason"] == "breakpoint", stopped
        frames = client.request("stackTrace", threadId=stopped["threadId"])["stackFrames"]
        assert (frames[0]["name"], frames[0]["line"]) == ("train_one_epoch", line)
        rank = client.request("evaluate", expression="parts.dist.rank", frameId=frames[0]["id"])
        assert rank["result"] == "1"  # the debugger is in rank 1's process
        client.request("setBreakpoints", source=source, breakpoints=[])
        client.request("continue", threadId=stopped["threadId"])
        assert launcher.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if client is not None:
            client.close()  # the adapter exits once its client and its process are gone
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    output = log.read_text()
    assert "[rank 1] WARNING rank 1: a debugger attached; training starts" in output
    assert "done: step 4 (started at 0, stopped by max_steps), 2 worker(s)" in output

    # --profile-steps 2-3: one trace per rank, recording exactly those steps.
    assert recorded_steps(out) == {"rank0": [[2, 3]], "rank1": [[2, 3]]}
