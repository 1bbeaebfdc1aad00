"""``dt-jobs sweep``: how far a training job scales, measured (issue 17).
Why it is built this way: docs/internals.md, `dt_commands/jobs/sweep.py`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dt_commands.jobs.sweep_inputs import SweepError, check_plotting, epoch_samples, report_folder
from dt_commands.jobs.sweep_local import sweep_local
from dt_commands.jobs.sweep_report import ReportError, Run, Sweep, write
from dt_commands.stack_outputs import JobsError, pulumi_stack
from infra import batch
from infra.batch import TASK_ID, state_text
from infra.job_spec import JobSpec
from infra.live_metrics import StorageError, blob_container, read_metrics
from infra.settings.checks import ConfigError
from infra.settings.cluster import MAX_NODES
from infra.settings.jobs import SHORTHAND_JOB
from infra.settings.stack import StackSettings
from infra.settings.values import REPO, load_schema
from infra.trainer_command import JobTrainer, trainer_flags, with_settings
from trainer.common.blob_folder import BlobFolder
from trainer.common.cli import fail, int_in, number_in
from trainer.common.errors import ConfigError as TrainerConfigError
from trainer.common.values import shown
from trainer.launch.node_sizes import MAX_WORKERS_PER_NODE, workers_per_node
from trainer.settings.choices import MAX_STEPS
from trainer.settings.train_config import TrainConfig

DYNAMIC_TYPE = "pulumi-python:dynamic:Resource"
POLL_SECONDS = 30.0
DEFAULT_TIMEOUT_MINUTES = 180.0  # a pool scaling up from zero takes minutes before training
# Which Batch job states mean the sweep job is over (its task ended: terminatejob).
DONE_STATE = "completed"


# ---------------------------------------------------------------------- options
def counts(high: int) -> Callable[[str], tuple[int, ...]]:
    """An argparse type for ``1,2,4``: distinct integers in 1..``high``, ascending."""

    def parse_counts(text: str) -> tuple[int, ...]:
        words = [word.strip() for word in text.split(",")]
        if not text.strip() or not all(w.isascii() and w.isdigit() and len(w) < 9 for w in words):
            raise argparse.ArgumentTypeError(
                f"{shown(text)}: give counts as positive integers separated by commas, e.g. 1,2,4"
            )
        values = sorted({int(word) for word in words})
        if values[0] < 1 or values[-1] > high:
            raise argparse.ArgumentTypeError(
                f"{shown(text)}: a count must be at least 1 and at most {high}, e.g. 1,2,4"
            )
        return tuple(values)

    return parse_counts


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """The ``sweep`` subcommand of ``dt-jobs`` (``dt_commands.jobs.main``); trainer flags for
    ``--local`` follow the options."""
    sub = commands.add_parser(
        "sweep",
        help="measure throughput, efficiency, epoch time and cost at several node/worker counts",
    )
    where = sub.add_mutually_exclusive_group(required=True)
    where.add_argument("--stack", help="sweep the deployed job of this stack on its pool")
    where.add_argument(
        "--local", action="store_true", help="run on this machine's CPU (trainer flags follow)"
    )
    sub.add_argument("--job", help="which job of the stack's jobs (needed if several)")
    sub.add_argument("--state-file", type=Path, help="JSON of `pulumi stack export`")
    sub.add_argument("--nodes", type=counts(MAX_NODES), help="node counts on the pool, e.g. 1,2,4")
    sub.add_argument(
        "--workers", type=counts(MAX_WORKERS_PER_NODE), help="--local: worker counts, e.g. 1,2"
    )
    sub.add_argument("--steps", type=int_in(1, MAX_STEPS), required=True, help="steps of every run")
    sub.add_argument(
        "--epoch-samples",
        type=int_in(1, MAX_STEPS),
        help="images (tokens for a language model) in one epoch; default: the synthetic "
        "data's size; needed for other data",
    )
    sub.add_argument("--report", type=Path, help="report folder (default: runs/sweep/<name>)")
    sub.add_argument(
        "--timeout-minutes",
        type=number_in(0.0, 7 * 24 * 60.0, low_open=True),
        default=DEFAULT_TIMEOUT_MINUTES,
        help="stop waiting for the jobs after this long (they keep running)",
    )
    return sub


def with_steps(settings: JobTrainer, steps: int) -> JobTrainer:
    """A job's own trainer settings with ``max_steps`` in place of their own step limits."""
    return with_settings(settings, run_steps=None, max_steps=str(steps))


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


# ---------------------------------------------------------------------- the stack's pool
def read_state(stack: str, state_file: Path | None) -> dict[str, Any]:
    """The stack's state: ``state_file`` or ``pulumi stack export``."""
    if state_file is not None:
        where = f"state_file={state_file}"
        try:
            data = state_file.read_bytes()
        except (OSError, ValueError) as err:
            reason = getattr(err, "strerror", None) or err
            raise SweepError(f"{where}: cannot read it ({reason})") from None
    else:
        where = f"stack={stack}"
        try:
            data = pulumi_stack(["export"], stack, "--state-file").encode()
        except JobsError as err:
            raise SweepError(str(err)) from None
    try:
        state = json.loads(data)
    except (ValueError, RecursionError):
        raise SweepError(f"{where}: not JSON; give the output of `pulumi stack export`") from None
    if not isinstance(state, dict) or not isinstance(state.get("deployment"), dict):
        raise SweepError(f"{where}: not the output of `pulumi stack export` (no deployment)")
    return state


def deployed_spec(state: dict[str, Any], stack: str, job: str | None) -> JobSpec:
    """The deployed job's spec: the inputs its ``TrainingJob`` resource was created with."""
    resources = state["deployment"].get("resources") or []
    specs: dict[str, JobSpec] = {}
    for resource in resources if isinstance(resources, list) else []:
        if not isinstance(resource, dict):
            continue
        inputs = resource.get("inputs")
        if (
            resource.get("type") != DYNAMIC_TYPE
            or not isinstance(inputs, dict)
            or "trainer_args" not in inputs
            or resource.get("delete")  # replaced, waiting to be deleted
        ):
            continue
        try:
            spec = JobSpec.from_props(inputs)
        except (TypeError, ValueError):
            raise SweepError(
                f"stack={stack}: the job {resource.get('urn')} in the state has inputs this "
                "version cannot read; run `pulumi up` with this version first"
            ) from None
        if not spec.settings_render_flags:
            raise SweepError(
                f"stack={stack}: the job {resource.get('urn')} in the state has no trainer "
                "settings this version can read; run `pulumi up` with this version first"
            )
        specs[spec.name or SHORTHAND_JOB] = spec
    names = ", ".join(sorted(specs))
    if not specs:
        raise SweepError(f"stack={stack}: the state has no training job; is `pulumi up` done?")
    if job is None:
        if len(specs) > 1:
            raise SweepError(f"stack={stack}: has {len(specs)} jobs ({names}); pass --job NAME")
        return next(iter(specs.values()))
    if job not in specs:
        raise SweepError(f"job={job}: stack {stack} has no such job; its jobs: {names}")
    return specs[job]


def sweep_spec(spec: JobSpec, nodes: int, steps: int, stamp: str) -> JobSpec:
    """The stack's job with only its node count, steps and name changed. The name makes the
    job id and the run folder new (``JobSpec.job_id``, ``run_name``): a sweep never resumes
    the stack's run or an earlier sweep's."""
    name = f"{spec.name or SHORTHAND_JOB}-sweep-{stamp}-{nodes}n"
    settings = with_steps(spec.trainer_settings, steps)
    return replace(
        spec,
        node_count=nodes,
        trainer_settings=settings,
        trainer_args=trainer_flags(settings),
        name=name,
    )


def _props(spec: JobSpec) -> dict[str, Any]:
    """A spec as the job resource's provider receives it (lists, as Pulumi passes them)."""
    props: dict[str, Any] = {f.name: getattr(spec, f.name) for f in fields(spec)}
    props["trainer_args"] = list(spec.trainer_args)
    props["trainer_settings"] = [list(pair) for pair in spec.trainer_settings]
    return props


def _stack_settings(stack: str) -> StackSettings:
    from dt_commands.plan import read_stack_file

    values = read_stack_file(REPO / f"Pulumi.{stack}.yaml")
    return StackSettings.from_mapping(stack, values, load_schema())


@dataclass
class Submitted:
    spec: JobSpec
    done: bool = False


def submit(specs: Sequence[JobSpec], submitted: list[Submitted], out: Any) -> None:
    """Create each job exactly as the stack's job resource creates its job, adding it to
    ``submitted`` (which an interrupted sweep names) as soon as Batch has it."""
    from infra.job import TrainingJobProvider

    for spec in specs:
        TrainingJobProvider().create(_props(spec))
        submitted.append(Submitted(spec))
        out.write(f"submitted {spec.job_id}: {spec.node_count} x {spec.vm_size}\n")
        out.flush()


def wait(jobs: Sequence[Submitted], timeout_seconds: float, out: Any) -> None:
    """Poll Batch every ``POLL_SECONDS`` until every job completed; SweepError (exit 1) after
    ``timeout_seconds``."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        for job in jobs:
            if job.done:
                continue
            client = batch.client(job.spec.endpoint)
            if state_text(client.get_job(job.spec.job_id).state) == DONE_STATE:
                job.done = True
                out.write(f"{job.spec.job_id}: completed\n")
                out.flush()
        pending = [job.spec.job_id for job in jobs if not job.done]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise SweepError(
                f"timed out after {timeout_seconds / 60:g} min; still running: "
                f"{', '.join(pending)} (raise --timeout-minutes, or cancel them in the portal); "
                "no report written",
                1,
            )
        time.sleep(POLL_SECONDS)


def _failed(spec: JobSpec) -> str | None:
    """Why the job's task failed; None when it succeeded."""
    task = batch.client(spec.endpoint).get_task(spec.job_id, TASK_ID)
    info = task.execution_info
    if info is None:
        return "its task never ran"
    result = state_text(info.result) if info.result is not None else None
    if result == "failure" or (info.exit_code is not None and info.exit_code != 0):
        reason = info.failure_info.message if info.failure_info is not None else None
        return f"exit code {info.exit_code}" + (f", {reason}" if reason else "")
    return None


def measure_job(spec: JobSpec) -> tuple[Run, str]:
    """The job's run from what its rank 0 uploaded (``dt-jobs metrics`` reads the same)."""
    folder = BlobFolder.parse(spec.metrics_url)
    records, _ = read_metrics(blob_container(folder), folder)
    workers = spec.node_count * workers_per_node(spec.vm_size)
    return Run.from_records(spec.node_count, workers, records, f"job {spec.job_id}")


def sweep_stack(args: argparse.Namespace, out: Any, stamp: str) -> int:
    if args.workers is not None:
        raise SweepError("--workers: for --local; a pool's sweep takes --nodes")
    if args.nodes is None:
        raise SweepError("--nodes: required with --stack, e.g. --nodes 1,2,4")
    try:
        settings = _stack_settings(args.stack)
    except ConfigError as err:
        raise SweepError(f"stack={args.stack}: {err}") from None
    most = settings.cluster.node_count
    if args.nodes[-1] > most:
        raise SweepError(
            f"--nodes={','.join(map(str, args.nodes))}: the pool of stack {args.stack} has at "
            f"most {most} nodes (nodeCount); sweep at most that many"
        )
    spec = deployed_spec(read_state(args.stack, args.state_file), args.stack, args.job)
    try:
        cfg = TrainConfig.from_mapping(dict(with_steps(spec.trainer_settings, args.steps)))
    except TrainerConfigError as err:
        raise SweepError(f"job {spec.job_id}: {err}") from None
    samples = epoch_samples(cfg, args.epoch_samples)
    report = report_folder(args.report, f"{args.stack}-{stamp}")
    check_plotting()
    specs = [sweep_spec(spec, nodes, args.steps, stamp) for nodes in args.nodes]
    submitted: list[Submitted] = []
    try:
        submit(specs, submitted, out)
        wait(submitted, args.timeout_minutes * 60, out)
    except KeyboardInterrupt:
        names = ", ".join(job.spec.job_id for job in submitted) or "none"
        fail(f"interrupted: no report written; the submitted jobs keep running: {names}", 130)
    # A sweep job is no stack output: its task's stdout.txt in the logs container says why.
    failures = [
        f"{spec.job_id} ({why}; its log: {spec.log_url}stdout.txt)"
        for spec in specs
        if (why := _failed(spec))
    ]
    if failures:
        raise SweepError(f"job(s) failed: {'; '.join(failures)}; no report written", 1)
    measured = [measure_job(spec) for spec in specs]
    name = spec.name or SHORTHAND_JOB
    sweep = Sweep(
        title=f"stack {args.stack}, job {name}, {spec.vm_size}",
        axis="nodes",
        unit=measured[0][1],
        epoch_samples=samples,
        runs=tuple(run for run, _ in measured),
        vm_size=spec.vm_size,
    )
    out.write(f"report: {write(sweep, report)}/report.md\n")
    return 0


def run(args: argparse.Namespace, trainer_flags: Sequence[str], out: Any = None) -> int:
    """``dt-jobs sweep``: every error is one line; bad input exits 2 before anything runs."""
    from infra.batch_calls import JobError
    from trainer.common.azure_sdk import AzureError

    out = out or sys.stdout
    stamp = _stamp()
    try:
        if args.local:
            return sweep_local(args, trainer_flags, out, stamp)
        if trainer_flags:
            raise SweepError(
                f"unrecognized arguments: {' '.join(trainer_flags)} (trainer flags are for "
                "--local; a stack's sweep trains with its job's settings)"
            )
        return sweep_stack(args, out, stamp)
    except SweepError as err:
        fail(str(err), err.code)
    except (ReportError, StorageError) as err:
        fail(str(err), err.code)
    except JobError as err:
        fail(str(err), 1)
    except AzureError as err:
        fail(f"Batch: {str(err).splitlines()[0]}", 1)
    except KeyboardInterrupt:
        fail("interrupted: no report written", 130)
