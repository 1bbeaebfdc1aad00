"""``dt-jobs metrics``: the last logged training steps and their mean throughput, read from what
the trainer's rank 0 uploads to the job's ``metrics_url`` (``trainer.outputs.live_upload``)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any, TextIO

from dt_commands.jobs.call import Call
from dt_commands.jobs.table import table
from dt_commands.stack_outputs import Job
from infra.live_metrics import (
    METRICS_FILE,
    blob_container,
    noise_advice,
    number,
    rate_key,
    read_metrics,
    straggler_lines,
    train_records,
)
from trainer.common.blob_folder import BlobFolder
from trainer.common.cli import int_in

NAME = "metrics"
HELP = "the last logged steps and the throughput, from the uploaded metrics"
LAST_STEPS = 10


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--last", type=int_in(1, 1_000_000), default=LAST_STEPS, help="logged steps to show"
    )


def run(call: Call) -> int:
    job = call.job()
    folder = call.metrics_folder(job)
    return metrics(blob_container(folder), folder, job, call.out, last=call.args.last)


def _number(record: dict[str, Any], key: str, spec: str) -> str:
    value = number(record, key)
    return "-" if value is None else format(value, spec)


def _mean_rate(records: list[dict[str, Any]], key: str) -> float | None:
    rates = [v for r in records if (v := number(r, key)) is not None]
    return sum(rates) / len(rates) if rates else None


def _uploaded(when: datetime | None) -> str:
    if when is None:
        return ""
    age = max(0, int((datetime.now(UTC) - when).total_seconds()))
    return f", uploaded {when:%Y-%m-%d %H:%M:%S} UTC ({age // 60} min {age % 60} s ago)"


def metrics(
    container: Any, folder: BlobFolder, job: Job, out: TextIO, *, last: int = LAST_STEPS
) -> int:
    """The last ``last`` logged training steps and their mean throughput."""
    records, when = read_metrics(container, folder)
    train = train_records(records)
    out.write(f"job {job.name} ({job.job_id}): {folder.url}{METRICS_FILE}{_uploaded(when)}\n")
    if not train:
        out.write("no training steps logged yet\n")
        return 0
    shown = train[-last:]
    unit, key = rate_key(shown)  # tokens for a language model's run, images otherwise
    rows = [("step", "epoch", "loss", f"{unit}/s")]
    rows += [
        (
            str(r["step"]),
            _number(r, "epoch", "g"),
            _number(r, "loss", ".4f"),
            _number(r, key, ".1f"),
        )
        for r in shown
    ]
    out.write(table(rows, right={0, 1, 2, 3}))
    recent, overall = _mean_rate(shown, key), _mean_rate(train, key)
    if recent is not None and overall is not None:
        out.write(
            f"throughput: {recent:.1f} {unit}/s total, mean of the last {len(shown)} logged "
            f"steps ({overall:.1f} over all {len(train)} in the file)\n"
        )
    evals = [r for r in records if r.get("kind") == "eval"]  # trainer.training.run's val_* records
    if evals:
        e = evals[-1]
        out.write(
            f"last evaluation: step {e.get('step')}, epoch {e.get('epoch')}, loss "
            f"{_number(e, 'val_loss', '.4f')}, accuracy {_number(e, 'val_accuracy', '.4f')}\n"
        )
    # --noise-scale-every: the latest smoothed estimate, as the run's own summary says it.
    if (noise := noise_advice(records)) is not None:
        out.write(noise + "\n")
    for line in straggler_lines(records):  # --straggler-every: the latest window's
        out.write(f"straggler: {line}\n")
    return 0
