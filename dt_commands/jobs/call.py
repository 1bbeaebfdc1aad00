"""What a ``dt-jobs`` command is given: its arguments, the stack's outputs (read once) and the
clients it may make; it remembers which stack or job an Azure error is about."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from dt_commands.stack_outputs import Job, OutputsError, require, select_job
from trainer.common.blob_folder import BlobFolder


@dataclass
class Call:
    args: argparse.Namespace
    outputs: dict[str, Any]
    client_factory: Callable[[str], Any]  # Batch endpoint -> client (infra.batch.client)
    start: Callable[[list[str]], Any]  # starts TensorBoard (dt-jobs tensorboard)
    out: TextIO
    err: TextIO
    where: str = ""  # what an Azure error names: the stack, then the selected job

    def __post_init__(self) -> None:
        self.where = self.where or f"stack={self.args.stack}"

    def client(self) -> Any:
        """The Batch client of the stack's account."""
        return self.client_factory(require(self.outputs, "batch_account_endpoint", self.stack))

    def job(self) -> Job:
        """The job ``--job`` names (or the stack's only one)."""
        job = select_job(self.outputs, self.stack, self.args.job)
        self.where = f"job {job.job_id}"
        return job

    def metrics_folder(self, job: Job) -> BlobFolder:
        """Where the job's rank 0 uploads its metrics; OutputsError when the stack names none."""
        if job.metrics is None:
            raise OutputsError(
                f"stack={self.stack}: job {job.name} has no metrics_url (nor job_log_url) "
                "output; is `pulumi up` done with this version?"
            )
        return job.metrics

    @property
    def stack(self) -> str:
        return self.args.stack
