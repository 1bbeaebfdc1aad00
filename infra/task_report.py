"""How the task's last finished try ended, as its primary's report says in the task's
stdout.txt: read through the Batch file API by the job's refresh (``infra.job``, the ``last_try``
output) and by ``dt-jobs status``."""

from __future__ import annotations

from typing import Any

from infra.batch import TASK_ID

# The primary's report ends each try's output with one line (trainer.launch.records, which infra
# may not import; tests/trainer/launch/test_launch_env.py holds the two together): a failed try's
# names the node whose worker failed, by address and Batch node id.
REPORT_MARK = "===== attempt "
TAIL_BYTES = 16384


def last_try_line(client: Any, job_id: str) -> str | None:
    """The report's line of the task's last finished try, from the primary's stdout.txt; None
    when there is none to read (no try ended yet, a retry started a new file, or the file is not
    readable)."""
    from trainer.common.azure_sdk import AzureError

    try:
        size = int(client.get_task_file_properties(job_id, TASK_ID, "stdout.txt").content_length)
        first = max(0, size - TAIL_BYTES)
        span = f"bytes={first}-{size - 1}" if size else None
        data = b"".join(client.download_task_file(job_id, TASK_ID, "stdout.txt", ocp_range=span))
    except (AzureError, OSError, ValueError, TypeError):
        return None
    lines = data.decode("utf-8", "replace").splitlines()
    return next(
        (line[len("===== ") :] for line in reversed(lines) if line.startswith(REPORT_MARK)), None
    )
