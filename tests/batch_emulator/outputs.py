"""A task's output files (``outputFiles``), uploaded after each try by the node with the
identity each destination names (``articles/batch/batch-task-output-files.md``)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.batch_emulator import AGENT
from tests.batch_emulator.declared import lower
from tests.batch_emulator.image import PayloadError
from tests.batch_emulator.node import Node

if TYPE_CHECKING:
    from tests.batch_emulator.cluster import Cluster


def output_uploads(
    task: dict[str, Any], env: dict[str, str], code: int, identities: dict[str, str]
) -> list[dict[str, str]]:
    """batch-task-output-files.md ("The Batch service then writes any output data to that
    container when the task is complete"), after each try: the files matching each
    outputFile's pattern (OutputFile.filePattern: relative to the task working directory, $VAR
    expanded first, names starting with "." not matched by wildcards) whose uploadCondition
    holds for ``code``; a pattern without wildcards uploads to the blob named by ``path``, one
    with wildcards under ``path`` as a virtual folder. For multi-instance tasks only from the
    primary's node (OutputFile docs)."""
    uploads = []
    base = Path(env["AZ_BATCH_TASK_WORKING_DIR"])
    for output in task.get("outputFiles") or []:
        condition = lower(output["uploadOptions"]["uploadCondition"])
        if (condition == "tasksuccess" and code != 0) or (condition == "taskfailure" and code == 0):
            continue
        pattern = output["filePattern"]
        for key in sorted(env, key=len, reverse=True):
            pattern = pattern.replace(f"${{{key}}}", env[key]).replace(f"${key}", env[key])
        full = pattern if pattern.startswith("/") else str(base / pattern)
        wildcard = any(c in output["filePattern"] for c in "*?[")
        destination = output["destination"]["container"]
        identity = (destination.get("identityReference") or {}).get("resourceId")
        client = next((c for c, r in identities.items() if r == identity), None)
        if client is None:
            raise PayloadError(f"output file identity {identity} is not the pool's")
        for match in sorted(glob.glob(full, recursive=True)):
            if not os.path.isfile(match):
                continue
            blob = destination.get("path") or os.path.basename(match)
            if wildcard:
                prefix = (destination.get("path") or "").rstrip("/")
                relative = os.path.relpath(match, base)
                blob = f"{prefix}/{relative}" if prefix else relative
            uploads.append(
                {
                    "file": match,
                    "container_url": destination["containerUrl"],
                    "blob": blob,
                    "client_id": client,
                }
            )
    return uploads


def upload_outputs(
    cluster: Cluster, node: Node, task: dict[str, Any], env: dict[str, str], code: int
):
    """The task's output files, uploaded by the node (see ``output_uploads``) with the
    identity each destination names."""
    uploads = output_uploads(task, env, code, cluster.identities)
    if not uploads:
        return
    spec = cluster.base / "specs" / f"upload-{time.monotonic_ns()}.json"
    spec.write_text(json.dumps({"uploads": uploads}))
    env_vars = {**os.environ, "REQUESTS_CA_BUNDLE": str(cluster.storage.ca_file)}
    if not cluster.vnet.isolated:
        env_vars["AZURE_POD_IDENTITY_AUTHORITY_HOST"] = node.imds_endpoint
    result = subprocess.run(
        [*cluster.vnet.exec_prefix(node.ns), sys.executable, str(AGENT), "upload", str(spec)],
        capture_output=True,
        text=True,
        env=env_vars,
        timeout=120,
    )
    cluster.log(f"node {node.index}: output upload exit {result.returncode}: {result.stdout}")
    if result.returncode != 0:
        # fileuploaderr.txt on a real node; the task gets a failure info, not a retry.
        (node.root / "fileuploaderr.txt").write_text(result.stderr)
        cluster.log(f"node {node.index}: output upload failed: {result.stderr[-2000:]}")
