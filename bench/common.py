"""Shared benchmark plumbing: machine facts, result files, and trainer runs measured from their
own metrics windows (the first window, with warm-up, is left out)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
BIN = Path(sys.executable).parent


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d"),
    }
    try:
        import horovod

        info["horovod"] = horovod.__version__
    except ImportError:
        info["horovod"] = None
    return info


def save(name: str, results: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **results}, indent=2) + "\n")
    return path


def steady_rate(metrics_file: Path, key: str = "images_per_sec_total") -> float:
    """Median images/sec over the logged training windows after the first."""
    return steady_value(read_records(metrics_file), key)


def run_trainer(launcher: list[str], flags: list[str], env: dict[str, str] | None = None) -> float:
    """Run ``launcher -m trainer flags`` in a temp output folder; steady images/sec."""
    return steady_value(run_records(launcher, flags, env), "images_per_sec_total")


def horovodrun(workers: int) -> list[str]:
    hosts = f"localhost:{workers}"
    return [str(BIN / "horovodrun"), "--gloo", "-np", str(workers), "-H", hosts, sys.executable]


def torchrun(workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(workers),
    ]


def read_records(metrics_file: Path) -> list[dict[str, Any]]:
    """Every record of a run's metrics.jsonl, in order."""
    return [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]


def steady_value(records: list[dict[str, Any]], key: str) -> float:
    """Median of ``key`` over the "train" windows after the first (warm-up)."""
    values = [r[key] for r in records if r.get("kind") == "train"]
    return statistics.median(values[1:] or values)


def run_records(
    launcher: list[str], flags: list[str], env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Run ``launcher -m trainer flags`` in a temp output folder; its metrics records."""
    with tempfile.TemporaryDirectory() as temp:
        command = [*launcher, "-m", "trainer", *flags, "--output-dir", temp]
        log = Path(temp) / "launcher.log"
        with open(log, "w") as out:  # a file, never an unread pipe: workers would block
            result = subprocess.run(
                command,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                timeout=900,
            )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{log.read_text()[-3000:]}")
        return read_records(Path(temp) / "metrics.jsonl")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
