"""``dt-jobs sweep --local``: the trainer under the node launcher on this machine, once per
worker count (two emulated nodes' variables, a rendezvous port of its own), each run's metrics
read back for the report."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dt_commands.jobs.sweep_inputs import (
    SweepError,
    check_plotting,
    epoch_samples,
    report_folder,
    trainer_request,
)
from dt_commands.jobs.sweep_report import Run, Sweep, write
from infra.live_metrics import parse_records
from infra.settings.values import REPO
from infra.trainer_settings import JOB_BACKENDS

LOCAL_HOST = "127.0.0.1"
# The trainer settings the sweep sets for every run: its steps (--steps) and its run folder.
LOCAL_OWNED = ("max_steps", "run_steps", "output_dir")
# The gradient noise scale compares each worker's gradient with the reduced one: a one-worker run
# has only one (trainer.watch.noise_scale.NoiseScale needs two batch sizes): its run turns it off.
NOISE_OFF = ("--noise-scale-every", "0")
STOP_SECONDS = 60  # how long a stopped run may take to end before it is killed


def local_command(flags: Sequence[str], workers: int, output_dir: Path) -> list[str]:
    """The node launcher over the trainer, as a job's node runs it (``infra.batch``)."""
    trainer = [sys.executable, "-m", "trainer", *flags, "--output-dir", str(output_dir)]
    launch = [sys.executable, "-m", "trainer.launch", "--node-ip", LOCAL_HOST]
    return [*launch, "--workers-per-node", str(workers), "--", *trainer]


def local_env(rendezvous_port: int) -> dict[str, str]:
    """One simulated Batch node on 127.0.0.1 (the launcher's multi-instance variables)."""
    return {
        **os.environ,
        "AZ_BATCH_HOST_LIST": LOCAL_HOST,
        # The port beside the master's address is Batch's own; the launcher never uses it.
        "AZ_BATCH_MASTER_NODE": f"{LOCAL_HOST}:{rendezvous_port + 2}",
        "AZ_BATCH_IS_CURRENT_NODE_MASTER": "true",
        "MASTER_PORT": str(rendezvous_port),
        # One thread per worker, so N workers use N cores as N GPUs would (unless set).
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind((LOCAL_HOST, 0))
        return probe.getsockname()[1]


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the launcher (it forwards it to its workers); SIGKILL to the whole group if
    they outstay the grace period."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run_local(flags: Sequence[str], workers: int, folder: Path) -> list[dict[str, Any]]:
    """One run under the launcher; its metrics records."""
    output_dir = folder / f"workers-{workers}"
    log_path = folder / f"workers-{workers}.log"
    with open(log_path, "wb") as log:  # a file, never an unread pipe: the workers would block
        process = subprocess.Popen(
            local_command(flags, workers, output_dir),
            cwd=REPO,
            env=local_env(_free_port()),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the sweep, which stops the run
        )
        try:
            code = process.wait()
        finally:
            _stop(process)
    if code != 0:
        lines = log_path.read_text(errors="replace").strip().splitlines() or ["no output"]
        errors = [line for line in lines if "error" in line.lower()] or lines
        raise SweepError(f"workers={workers}: the run failed (exit {code}): {errors[-1]}", 1)
    return parse_records((output_dir / "metrics.jsonl").read_bytes())


def sweep_local(args: argparse.Namespace, flags: Sequence[str], out: Any, stamp: str) -> int:
    if args.nodes is not None or args.job is not None or args.state_file is not None:
        raise SweepError("--local runs on this machine: give --workers (not --nodes/--job)")
    if args.workers is None:
        raise SweepError("--workers: required with --local, e.g. --workers 1,2")
    given = trainer_request(flags, "trainer flags").flagged
    owned = [key for key in LOCAL_OWNED if key in given]
    if owned:
        raise SweepError(
            f"--{owned[0].replace('_', '-')}: the sweep sets it for each run; use --steps (and "
            "--report for where the report goes)"
        )
    flags = [*flags, "--max-steps", str(args.steps)]
    cfg = trainer_request(flags, "trainer flags").config
    if cfg.backend not in JOB_BACKENDS:
        raise SweepError(
            f"backend={cfg.backend}: the sweep runs the node launcher, which starts "
            f"{', '.join(JOB_BACKENDS)} workers; choose one of them"
        )
    samples = epoch_samples(cfg, args.epoch_samples)
    report = report_folder(args.report, f"local-{stamp}")
    check_plotting()
    runs: list[Run] = []
    units: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="sweep-") as temp:
        for workers in args.workers:
            run_flags = flags if workers > 1 else [*flags, *NOISE_OFF]
            out.write(f"workers={workers}: training {args.steps} steps\n")
            out.flush()
            records = run_local(run_flags, workers, Path(temp))
            run, unit = Run.from_records(workers, workers, records, f"workers={workers}")
            out.write(f"workers={workers}: {run.samples_per_sec:.1f} {unit}/s\n")
            runs.append(run)
            units.add(unit)
    sweep = Sweep(
        title=f"local CPU, {cfg.model}, batch {cfg.batch_size} per worker, {cfg.backend}",
        axis="workers",
        unit=units.pop(),
        epoch_samples=samples,
        runs=tuple(runs),
    )
    out.write(f"report: {write(sweep, report)}/report.md\n")
    return 0
