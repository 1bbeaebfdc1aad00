"""``dt-jobs keep-out NODE...``: the job's next tries never land on these nodes of its pool
(Batch's disable scheduling: a task running there finishes, no new one starts); ``--undo``
lets them back. For a node whose rank failed but whose own checks pass: one they find sick keeps
itself out (infra/node_checks.py). Why the nodes hold no right to do this: docs/jobs.md. It
writes to the pool (``pools/write``), which the team's Job Submitter role does not hold:
docs/deploy.md, Who may do what."""

from __future__ import annotations

import argparse
import re
from typing import Any, TextIO

from dt_commands.jobs.call import Call
from dt_commands.stack_outputs import JobsError
from infra.batch import state_text

NAME = "keep-out"
HELP = "keep nodes out of the job's next tries (disable scheduling); --undo lets them back"
NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,256}")  # tvmps_<64 hex digits>_d and the like
# The Batch action a node's scheduling state needs; Azure Batch Job Submitter, the role the
# stack gives the deployer and the team, holds `pools/read` alone of the pool's actions.
POOL_WRITE = "Microsoft.Batch/batchAccounts/pools/write"


class RightMissing(JobsError):
    """Batch refused the caller the pool write this command needs (exit 1: a right, not the
    command, is what is missing)."""

    code = 1


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "nodes", nargs="+", metavar="NODE", help="Batch node ids (dt-jobs status names them)"
    )
    sub.add_argument("--undo", action="store_true", help="let the nodes take tasks again")


def run(call: Call) -> int:
    for node_id in call.args.nodes:
        # Batch's node ids are words (tvmps_<hex>_d); anything else would address another
        # path of the pool's API ("..": the pool itself) and be misread as a node's state.
        if not NODE_ID.fullmatch(node_id):
            raise JobsError(
                f"NODE={node_id!r}: not a Batch node id; give the ids `dt-jobs status` names"
            )
    job = call.job()
    client = call.client()
    pool_info = client.get_job(job.job_id).pool_info
    pool_id = pool_info.pool_id if pool_info is not None else None
    if not pool_id:
        call.err.write(f"error: job {job.job_id} names no pool; nothing to keep out of\n")
        return 2
    from trainer.common.azure_sdk import HttpResponseError

    try:
        return keep_out(client, pool_id, call.args.nodes, call.args.undo, call.out)
    except HttpResponseError as err:
        if err.status_code != 403:
            raise
        raise RightMissing(
            f"job {job.job_id}: Batch refused to change node scheduling on pool {pool_id} "
            f"(403 {getattr(err, 'error_code', None) or 'AuthorizationFailure'}): it needs "
            f"{POOL_WRITE}, which your role (Azure Batch Job Submitter, the team's) does not "
            "hold; ask someone with Owner or Contributor on the stack's resource group (its "
            "deployer) to run it, or to grant you Azure Batch Data Contributor on the account"
        ) from None


def keep_out(client: Any, pool_id: str, nodes: list[str], undo: bool, out: TextIO) -> int:
    from infra.azure_sdk import batch_models

    # taskcompletion: a task still running there (another job's, or this job's own try) ends
    # as it would; requeue would kill it and count nothing against its retries.
    options = batch_models.BatchNodeDisableSchedulingOptions(
        node_disable_scheduling_option="taskcompletion"
    )
    # Every node read first (disabling works only while scheduling is enabled), so a node the
    # pool does not have stops the command before any node is changed.
    enabled = {node_id: _enabled(client, pool_id, node_id) for node_id in nodes}
    for node_id, is_enabled in enabled.items():
        if undo and not is_enabled:
            client.enable_node_scheduling(pool_id, node_id)
            out.write(f"pool {pool_id}: node {node_id} takes tasks again\n")
        elif not undo and is_enabled:
            client.disable_node_scheduling(pool_id, node_id, options)
            out.write(
                f"pool {pool_id}: node {node_id} takes no new task (the job's next tries go "
                f"elsewhere); it still bills: `dt-jobs keep-out --undo {node_id}` or remove "
                "it from the pool\n"
            )
        else:
            state = "takes tasks" if is_enabled else "is kept out"
            out.write(f"pool {pool_id}: node {node_id} already {state}\n")
    return 0


def _enabled(client: Any, pool_id: str, node_id: str) -> bool:
    from trainer.common.azure_sdk import ResourceNotFoundError

    try:
        return state_text(client.get_node(pool_id, node_id).scheduling_state) == "enabled"
    except ResourceNotFoundError:
        raise JobsError(
            f"NODE={node_id!r}: pool {pool_id} has no such node; give the ids `dt-jobs "
            "status` names"
        ) from None
