"""What Batch documents of every task, start task, job preparation or multi-instance task alike:
how its command line is split, which user runs it, its environment variables and its folders."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from tests.batch_emulator.declared import PoolSpec, lower
from tests.batch_emulator.image import PayloadError
from tests.batch_emulator.node import Node

# The pool-scope auto-user. Batch does not document its uid; any non-root uid that the image
# does not know (the image's own user is 1000) is the strict case: no HOME of its own.
TASK_USER = (1001, 1001)
ROOT = (0, 0)
# The port in AZ_BATCH_MASTER_NODE; batch-compute-node-environment-variables.md gives
# `10.0.0.4:6000` as the example and reserves that port for Batch.
BATCH_PORT = 6000


def command_argv(command_line: str) -> list[str]:
    """The command line is not run under a shell (batch-compute-node-environment-variables.md,
    "Command-line expansion"): Batch splits it into the program and its arguments. The split
    follows POSIX shell quoting, the documented way to pass `/bin/sh -c "..."`."""
    try:
        argv = shlex.split(command_line)
    except ValueError as error:
        raise PayloadError(f"command line cannot be split ({error}): {command_line}") from None
    if not argv:
        raise PayloadError("empty command line")
    return argv


def user_of(identity: dict[str, Any] | None) -> tuple[int, int]:
    auto = (identity or {}).get("autoUser") or {}
    if identity and identity.get("username"):
        raise PayloadError("named user accounts are not emulated")
    return ROOT if lower(auto.get("elevationLevel")) == "admin" else TASK_USER


def env_settings(task: dict[str, Any]) -> dict[str, str]:
    """The task's own environmentSettings."""
    return {e["name"]: e.get("value", "") for e in task.get("environmentSettings") or []}


def task_folders(task_dir: Path, user: tuple[int, int]) -> None:
    """The task folder and its working directory, the task user's (files-and-directories.md:
    the task has read/write access to its working directory)."""
    for folder in (task_dir, task_dir / "wd"):
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, *user)
        os.chmod(folder, 0o755)


def base_env(pool: PoolSpec, node: Node) -> dict[str, str]:
    """batch-compute-node-environment-variables.md, variables for "All tasks"."""
    return {
        "AZ_BATCH_ACCOUNT_NAME": "emulated",
        "AZ_BATCH_ACCOUNT_URL": "https://emulated.eastus.batch.azure.com",
        "AZ_BATCH_POOL_ID": pool.pool_id,
        "AZ_BATCH_NODE_ID": node.id,
        "AZ_BATCH_NODE_IS_DEDICATED": "false" if node.spot else "true",
        "AZ_BATCH_NODE_ROOT_DIR": str(node.root),
        "AZ_BATCH_NODE_SHARED_DIR": str(node.shared_dir),
        "AZ_BATCH_NODE_STARTUP_DIR": str(node.startup_dir),
        "AZ_BATCH_NODE_MOUNTS_DIR": str(node.mounts_dir),
        "AZ_BATCH_TASK_RESERVED_EPHEMERAL_DISK_SPACE_BYTES": "1000000",
    }


def job_task_env(
    pool: PoolSpec, node: Node, job_id: str, task_id: str, task_dir: Path
) -> dict[str, str]:
    """A job's task's variables (a job preparation's or the job's task's), before its own."""
    return {
        **base_env(pool, node),
        "AZ_BATCH_JOB_ID": job_id,
        "AZ_BATCH_TASK_ID": task_id,
        "AZ_BATCH_TASK_DIR": str(task_dir),
        "AZ_BATCH_TASK_WORKING_DIR": str(task_dir / "wd"),
        "AZ_BATCH_CERTIFICATES_DIR": str(task_dir / "certs"),
    }


def multi_instance_env(
    node: Node, nodes: list[Node], master: Node, task_dir: Path
) -> dict[str, str]:
    """batch-compute-node-environment-variables.md, multi-instance variables."""
    hosts = [n.ip for n in nodes]
    return {
        "AZ_BATCH_HOST_LIST": ",".join(hosts),
        "AZ_BATCH_NODE_LIST": ";".join(hosts),
        "AZ_BATCH_MASTER_NODE": f"{master.ip}:{BATCH_PORT}",
        "AZ_BATCH_IS_CURRENT_NODE_MASTER": str(node is master).lower(),
        "AZ_BATCH_TASK_SHARED_DIR": str(task_dir),
        "CCP_NODES": f"{len(hosts)} " + " ".join(f"{h} 1" for h in hosts),
    }
