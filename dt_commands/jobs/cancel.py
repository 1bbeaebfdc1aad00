"""``dt-jobs cancel``: terminate the job; its checkpoints stay for a later `pulumi up --replace`."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from dt_commands.jobs.call import Call
from infra.batch import terminate_job

NAME = "cancel"
HELP = "terminate the job (checkpoints are kept)"


def add_arguments(sub: argparse.ArgumentParser) -> None:
    del sub  # --stack, --outputs-file and --job only


def run(call: Call) -> int:
    job = call.job()
    return cancel(call.client(), job.outputs, call.out)


def cancel(client: Any, outputs: dict[str, Any], out: TextIO) -> int:
    job_id = outputs["job_id"]
    terminate_job(client, job_id)
    out.write(
        f"job {job_id} terminated; its checkpoints stay in {outputs.get('job_checkpoint_path')}. "
        "Run `pulumi up --replace` on the job to start it again\n"
    )
    return 0
