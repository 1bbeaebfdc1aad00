"""The pool's start task on an emulated node, and the systemd units it leaves running.

It runs on the node itself (not in a container: it has no container settings), as its user
identity, every time the node starts (a new VM, a restart, a reimage)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.batch_emulator.image import DEFAULT_PATH, PayloadError
from tests.batch_emulator.mounts import admin_mounts
from tests.batch_emulator.node import Node
from tests.batch_emulator.tasks import ROOT, base_env, command_argv, env_settings, user_of

if TYPE_CHECKING:
    from tests.batch_emulator.cluster import Cluster


def prefetch_failed(cluster: Cluster, node: Node) -> bool:
    """The pool's containerImageNames, pulled as the node joins, before its start task: one the
    registry lacks leaves the node unusable with a node error, and it is never recovered ("If
    the container fails to download, the computeNodeError property reports the failure, and
    sets the node state to unusable"; "Batch doesn't automatically attempt to recover VMs that
    failed to install application packages or containers", articles/batch/
    batch-pool-node-error-checking.md, read 2026-11-29). Batch documents no code for it."""
    missing = [i for i in cluster.pool.prefetch_images if i not in cluster.registry_images]
    if not missing:
        return False
    node.state = "unusable"
    node.errors = [
        {"code": "ContainerImageDownloadFailed", "message": f"manifest for {missing[0]} not found"}
    ]
    cluster.log(f"node {node.index}: prefetch of {missing[0]} failed: unusable, no start task")
    return True


def run_start_task(cluster: Cluster, node: Node) -> None:
    """The pool's start task on ``node``. With waitForSuccess a node whose start task still
    fails after maxTaskRetryCount retries is unusable and gets no task (BatchStartTask
    waitForSuccess: "the Batch service marks the Node unusable, and will not schedule
    Tasks to it"; the node state is starttaskfailed)."""
    task = cluster.pool.start_task
    if not task:
        node.state = "idle"
        return
    retries = int(task.get("maxTaskRetryCount") or 0)
    user = user_of(task.get("userIdentity"))
    task_dir, workdir = node.startup_dir, node.startup_dir / "wd"
    env = _start_task_env(cluster, node, task, user)
    stage = cluster.base / "stage" / f"start-n{node.index}"
    stage.mkdir(parents=True, exist_ok=True)
    mounts = admin_mounts(cluster, node, stage)
    node.state = "starting"
    try:
        argv = command_argv(task["commandLine"])
    except PayloadError as error:
        # The process never starts: the start task fails on every try.
        (task_dir / "stderr.txt").write_text(f"emulated Batch: {error}\n")
        cluster.log(f"node {node.index}: start task cannot start: {error}")
        node.state = "starttaskfailed"
        return
    for attempt in range(retries + 1):
        proc = cluster.spawn(
            node,
            f"start-n{node.index}-try{attempt}",
            argv=argv,
            env=env,
            cwd=workdir,
            user=user,
            stdout=task_dir / "stdout.txt",
            stderr=task_dir / "stderr.txt",
            mounts=mounts,
        )
        code = proc.wait(120)
        proc.kill()
        node.start_task_exit = code
        cluster.log(f"node {node.index}: start task try {attempt} exited {code}")
        if code == 0:
            _start_units(cluster, node, mounts)
            node.state = "idle"
            return
    wait = task.get("waitForSuccess")
    node.state = "starttaskfailed" if wait is None or wait else "idle"


def _start_task_env(
    cluster: Cluster, node: Node, task: dict[str, Any], user: tuple[int, int]
) -> dict[str, str]:
    """The start task's working folder, made, and its environment."""
    task_dir = node.startup_dir
    workdir = task_dir / "wd"
    workdir.mkdir(parents=True, exist_ok=True)
    os.chown(workdir, *user)
    # The start task's waits (InfiniBand ports still INIT after boot: infra/cluster.py) run
    # on a clock of their own that passes at once: an emulated port is up or down from the
    # start, whatever the time, so only the wall-clock cost of the wait is left out.
    clock = node.hw / "start-task-clock"
    clock.mkdir(exist_ok=True)
    (clock / "sleep").write_text("#!/bin/sh\nexit 0\n")
    (clock / "sleep").chmod(0o755)
    env = {
        **base_env(cluster.pool, node),
        "AZ_BATCH_TASK_DIR": str(task_dir),
        "AZ_BATCH_TASK_WORKING_DIR": str(workdir),
        "PATH": f"{clock}:{node.hw / 'bin'}:{DEFAULT_PATH}",
        "HOME": "/root" if user[0] == 0 else str(workdir),
        **env_settings(task),
    }
    return env


def _start_units(cluster: Cluster, node: Node, mounts: list[dict[str, Any]]) -> None:
    """Start the transient units the start task asked systemd for, as root."""
    for request in sorted((node.hw / "units").glob("*.json")):
        unit = json.loads(request.read_text())
        request.unlink()
        env = {"PATH": f"{node.hw / 'bin'}:{DEFAULT_PATH}", **unit["env"]}
        log = cluster.base / "logs" / f"unit-{unit['name']}-n{node.index}.log"
        name = f"unit-{unit['name']}-n{node.index}-{len(node.units)}"
        proc = cluster.spawn(node, name, argv=unit["argv"], env=env, cwd=Path("/"), user=ROOT,
                             stdout=log, stderr=log, mounts=mounts)  # fmt: skip
        node.units.append(proc)
