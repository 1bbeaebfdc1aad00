"""Why a pool gives a job no nodes: its resize errors and the nodes that failed their start
task, one line each with the fix. Read by ``dt-jobs status`` (dt_commands/jobs/status.py), the job
resource's refresh (its ``pool_errors`` output, infra/job.py) and the acceptance check. Azure SDK
imports stay inside functions (the job resource's provider host imports this module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Resize error codes (Batch REST ``ResizeError``; the Azure support article "Azure Batch pool
# resizing failure" lists the quota codes) -> what to do.
QUOTA_FIX = (
    "request more for the Batch account, not the subscription (portal: Batch account > Quotas; "
    "`az batch account show` shows them), then resize or resubmit"
)
RESIZE_FIXES = {
    "AccountCoreQuotaReached": f"the account's total dedicated core quota is used up: {QUOTA_FIX}",
    "AccountVMSeriesCoreQuotaReached": (
        f"the account's dedicated core quota for this VM family is used up: {QUOTA_FIX}"
    ),
    "AccountLowPriorityCoreQuotaReached": (
        f"the account's Spot core quota is used up: {QUOTA_FIX}"
    ),
    "AccountSpotCoreQuotaReached": f"the account's Spot core quota is used up: {QUOTA_FIX}",
    "AllocationFailed": (
        "Azure had no capacity for this size in the region now: retry later, or choose another "
        "region or size"
    ),
    "AllocationTimedOut": (
        "the nodes did not come within the resize timeout: retry; if it repeats, look at the "
        "pool in the portal"
    ),
}
DEFAULT_RESIZE_FIX = "look at the pool's resize errors in the portal (Batch account > Pools)"
SHOWN_NODES = 3


def _named(ids: list[str]) -> str:
    """The first ``SHOWN_NODES`` node ids, and how many more."""
    more = f" and {len(ids) - SHOWN_NODES} more" if len(ids) > SHOWN_NODES else ""
    return ", ".join(ids[:SHOWN_NODES]) + more


def _first_line(text: Any) -> str:
    return (str(text or "").strip().splitlines() or [""])[0]


def resize_error_lines(pool_id: str, errors: Any) -> list[str]:
    lines = []
    for error in errors or []:
        code = str(getattr(error, "code", None) or "unknown")
        fix = RESIZE_FIXES.get(code, DEFAULT_RESIZE_FIX)
        message = _first_line(getattr(error, "message", ""))
        lines.append(f"pool {pool_id}: resize error {code} ({message}): {fix}")
    return lines


# The start task's own words: its last line on stderr names the failed check (infra.cluster).
START_TASK_STDERR = "startup/stderr.txt"
SAID_BYTES = 4096


def start_task_said(client: Any, pool_id: str, node_id: str) -> str:
    """The last line the node's start task wrote on stderr ("" when it cannot be read)."""
    return stderr_said(client, pool_id, node_id, START_TASK_STDERR)


def stderr_said(client: Any, pool_id: str, node_id: str, path: str) -> str:
    """The last line of the node's file ``path`` ("" when it cannot be read), from its last
    ``SAID_BYTES`` (pip or a failed check may write many KiB before the line that says why):
    read through the Batch file API, its size first (File - Get Properties), as `dt-jobs logs`
    reads a running task's files."""
    from trainer.common.azure_sdk import AzureError

    try:
        size = int(client.get_node_file_properties(pool_id, node_id, path).content_length)
        if size <= 0:
            return ""
        first = max(0, size - SAID_BYTES)
        data = b"".join(
            client.download_node_file(pool_id, node_id, path, ocp_range=f"bytes={first}-{size - 1}")
        )
    except (AzureError, OSError, TypeError, ValueError):  # unreadable: the reason is left out
        return ""
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
    if first > 0:
        lines = lines[1:]  # the range may start inside a line
    return next((line for line in reversed(lines) if line), "")


def start_task_line(
    pool_id: str,
    nodes: list[Any],
    cancel_hint: str,
    said: Callable[[str], str] = lambda node_id: "",
) -> str | None:
    """One line for the nodes in ``starttaskfailed``, quoting what the first one's start task
    said (``said``: a node id -> its start task's last stderr line); None when there are none."""
    # The fix it names is ending the task: the autoscale formula cannot see node states, and
    # the multi-instance task waiting for these nodes stays pending, which keeps the pool up
    # (infra.cluster.autoscale_formula). Once the job is cancelled, the formula drops the pool
    # to zero after its idle minutes.
    from infra.batch import state_text

    failed = [n for n in nodes if state_text(n.state) == "starttaskfailed"]
    if not failed:
        return None
    info = failed[0].start_task_info
    failure = getattr(info, "failure_info", None) if info is not None else None
    exit_code = getattr(info, "exit_code", None) if info is not None else None
    why = _first_line(getattr(failure, "message", "")) or f"exit code {exit_code}"
    if words := said(str(failed[0].id)):
        why += f"; {failed[0].id}'s start task said: {words}"
    shown = _named([str(n.id) for n in failed])
    return (
        f"pool {pool_id}: {len(failed)} of {len(nodes)} node(s) failed their start task "
        f"({shown}: {why}); they bill but never run a task, and the autoscale formula "
        f"cannot see node states: read startup/stderr.txt on a node (portal: the node's files), "
        f"fix the cause, then {cancel_hint} so the pool scales to zero, or reboot the nodes"
    )


def unusable_line(pool_id: str, nodes: list[Any], cancel_hint: str) -> str | None:
    """One line for the nodes in ``unusable``, with the first one's node error; None when there
    are none. A node whose prefetch of the pool's container image fails is one: "the
    computeNodeError property reports the failure, and sets the node state to unusable", and
    "Batch doesn't automatically attempt to recover VMs that failed to install application
    packages or containers" (articles/batch/batch-pool-node-error-checking.md, read
    2026-11-29). The pool prefetches the trainer image (infra.image.PREFETCH_TAG)."""
    from infra.batch import state_text

    unusable = [n for n in nodes if state_text(n.state) == "unusable"]
    if not unusable:
        return None
    errors = list(getattr(unusable[0], "errors", None) or [])
    why = "no node error given"
    if errors:
        code = str(getattr(errors[0], "code", None) or "unknown")
        why = f"{code}: {_first_line(getattr(errors[0], 'message', ''))}"
    shown = _named([str(n.id) for n in unusable])
    return (
        f"pool {pool_id}: {len(unusable)} of {len(nodes)} node(s) are unusable ({shown}: "
        f"{why}); they bill but never run a task and Batch does not recover them: fix what the "
        "error names (a container image pull needs the nodes' AcrPull on the registry and the "
        f"registry's firewall to admit the pool's NAT address), then {cancel_hint} so the pool "
        "scales to zero, or remove the nodes (portal: Batch account > Pools > Nodes)"
    )


def preparation_line(client: Any, job_id: str, cancel_hint: str) -> str | None:
    """One line for the nodes where the job's preparation task (the job's code, then its
    dataset staging) failed, with what the first one's said last on stderr (the step that
    failed: trainer.launch.code_folder's fetch, hash or pip install, or the staging); None when
    there are none."""
    # A task whose preparation fails on a node goes back to active, "eligible to be assigned to
    # a different Compute Node" (BatchTaskState.Preparing); with every node failed it waits for
    # as long as the job lives, and only Job - List Preparation And Release Task Status says why.
    from infra.batch import state_text

    statuses = client.list_job_preparation_and_release_task_status(job_id)
    failed = [
        s
        for s in statuses
        if s.job_preparation_task_execution_info is not None
        and state_text(s.job_preparation_task_execution_info.result) == "failure"
    ]
    if not failed:
        return None
    first, info = failed[0], failed[0].job_preparation_task_execution_info
    why = f"exit code {info.exit_code}" if info.exit_code is not None else "no exit code"
    if info.task_root_directory and (
        words := stderr_said(
            client, first.pool_id, first.node_id, f"{info.task_root_directory}/stderr.txt"
        )
    ):
        why += f"; {first.node_id}'s preparation said: {words}"
    elif failure := _first_line(getattr(info.failure_info, "message", "")):
        why += f"; {failure}"
    shown = _named([str(s.node_id) for s in failed])
    return (
        f"job {job_id}: the job preparation task (the job's code, then its dataset staging) "
        f"failed on {len(failed)} node(s) ({shown}: {why}), so the training task never "
        "runs there and waits: read jobpreparation/stderr.txt on a node (portal: the node's "
        "files), fix what it names (the job's code or its requirements.txt, the dataset or "
        f"its grant), then {cancel_hint} and run `pulumi up` to submit it again"
    )


def pool_problems(
    client: Any, pool_id: str, cancel_hint: str = "cancel the job", job_id: str | None = None
) -> list[str]:
    """The pool's resize errors and start-task failures, and the nodes where ``job_id``'s
    preparation failed, one line each with the fix."""
    # Batch reports both only on the pool and its nodes, never on the job or its task, which
    # simply wait ("Check for pool and node errors",
    # articles/batch/batch-pool-node-error-checking.md): a resize that cannot get its nodes
    # leaves the pool steady with resizeErrors; a node whose start task fails (waitForSuccess)
    # goes to starttaskfailed and is never given a task, yet bills.
    from trainer.common.azure_sdk import ResourceNotFoundError

    try:
        pool = client.get_pool(pool_id)
    except ResourceNotFoundError:
        return [
            f"pool {pool_id}: does not exist, so the job's task waits for it: run `pulumi up` "
            "(it declares the pool)"
        ]
    lines = resize_error_lines(pool_id, pool.resize_errors)
    listed = list(client.list_nodes(pool_id))
    start_tasks = start_task_line(
        pool_id, listed, cancel_hint, lambda node_id: start_task_said(client, pool_id, node_id)
    )
    unusable = unusable_line(pool_id, listed, cancel_hint)
    staging = preparation_line(client, job_id, cancel_hint) if job_id else None
    return [*lines, *(line for line in (start_tasks, unusable, staging) if line)]
