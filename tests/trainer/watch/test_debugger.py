"""--debug-rank's refusals, each one line: a rank outside the world (exit 2) and a port that
cannot be listened on (exit 1, in a real trainer process). The attach itself runs on two real
workers in tests/trainer/watch/test_debugger_two_workers.py."""

import socket
import subprocess
import sys

import pytest

from tests.conftest import tiny_config
from trainer.common.errors import ConfigError
from trainer.engines.local import LocalDist
from trainer.settings.flags import to_flags
from trainer.settings.train_config import DEFAULTS
from trainer.watch.debugger import wait_for_debugger
from trainer.watch.signals import StopRequest


def test_a_rank_outside_the_world_names_the_ranks_there_are(tmp_path):
    cfg = DEFAULTS.replace(**tiny_config(tmp_path, backend="local", debug_rank=1))
    with pytest.raises(ConfigError, match=r"^debug_rank=1: the run has 1 worker\(s\), ranks 0..0"):
        wait_for_debugger(cfg, LocalDist(), StopRequest())


def test_a_port_in_use_stops_the_run_with_one_line_and_exit_1(tmp_path, no_leftover_processes):
    config = tiny_config(tmp_path / "out", backend="local", max_steps=1, debug_rank=0)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # every interface, where the debugger would listen
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "trainer", *to_flags({**config, "debug_port": port})],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: debug_port={port}: cannot listen on")
    assert lines[0].endswith("pick a free port with --debug-port")
    assert not (tmp_path / "out").exists()
