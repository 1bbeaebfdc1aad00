"""The training job on emulated nodes as the tests and ``bench.code_change`` drive it: booted
nodes, a team's code snapshotted and uploaded as ``pulumi up`` does, the job submitted exactly as
``infra.job`` submits it, waits with the emulator's story on failure, the workers' processes and
the run folder on the NFS server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from infra.batch import job_options, task_options
from infra.code_snapshot import CodeSnapshot, snapshot
from infra.job_spec import JobSpec
from infra.trainer_command import job_trainer, trainer_flags
from tests.batch_emulator.cluster import Cluster
from tests.batch_emulator.job_run import JobRun
from tests.batch_emulator.storage import Storage, blob
from tests.batch_emulator.vnet import VNet
from tests.support.wheels import write_wheel
from trainer.checkpoints.single_file import list_checkpoints
from trainer.settings.train_config import TrainConfig

# The trainer settings of a tiny run (16 px images, the tiny CNN).
TINY = {
    "model": "tiny", "num_classes": 5, "image_size": 16, "batch_size": 2, "synthetic_size": 64,
    "synthetic_pool": 16, "warmup_epochs": 1, "loader_workers": 0, "log_every": 1,
}  # fmt: skip
# The longest a test waits for one stage of a run (a start, a checkpoint, a retry).
RUN_SECONDS = 180
REQUIREMENT = "./wheels/team_dep-0.1-py3-none-any.whl\n"  # the team's own wheel, no index


def booted(make_cluster, stack, nodes: int = 2, **options) -> Cluster:
    """``nodes`` (two: the task's) of the CPU acceptance stack (one worker per node); every node
    must have passed the pool's start task."""
    cluster = make_cluster(stack, nodes=nodes, **options)
    failed = {
        node.index: (node.startup_dir / "stderr.txt").read_text()[-2000:]
        for node in cluster.nodes
        if node.state != "idle"
    }
    assert not failed, f"start task failed: {failed}"
    return cluster


def make_spec(stack, storage, trainer: dict[str, Any] | None = None, **changes) -> JobSpec:
    """The stack's TrainingJob inputs, with the emulated storage account and the changes; with
    ``trainer``, the job's own trainer settings are those (validated and spelled as a stack's
    trainer file is: ``infra.trainer_command.job_trainer``)."""
    values = {f.name: stack.job_props[f.name] for f in fields(JobSpec)}
    values.update(blob_endpoint=storage.blob_endpoint, dataset_prefix="")
    values.update(changes)
    if trainer is not None:
        staged = bool(values["dataset_prefix"])
        settings = job_trainer(trainer, TrainConfig.from_mapping(trainer), staged)
        values.update(trainer_settings=settings, trainer_args=trainer_flags(settings))
    values["trainer_args"] = list(values["trainer_args"])
    return JobSpec.from_props(values)


def team_repo(root: Path, team: str, files: dict[str, Path]) -> Path:
    """A git repository under ``root`` holding the team's folder ``team`` (``files``: name ->
    source, and a requirements file naming a wheel of its own); its path."""
    repo = root / "repo"
    folder = repo / team
    for name, source in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, folder / name)
    write_wheel(folder / "wheels", "team_dep", "VALUE = 3\n")
    (folder / "requirements.txt").write_text(REQUIREMENT)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", team], check=True)
    return repo


def upload_snapshot(vnet: VNet, storage: Storage, root: Path, snap: CodeSnapshot) -> float:
    """``snap`` put into the code container as CodeUpload puts it; the upload's own seconds."""
    archive = root / snap.blob_name
    archive.write_bytes(snap.data)
    os.chmod(root, 0o755)  # the storage side's helper reads it
    sent = blob(vnet, storage, "upload-file", container="code", blob=snap.blob_name,
                file=str(archive))  # fmt: skip
    return sent["seconds"]


def job_code(vnet: VNet, storage: Storage, root: Path, files: dict[str, Path]) -> CodeSnapshot:
    """A job's ``code:`` folder as a team gives it: ``files`` (name in the folder -> source)
    in a git repository's ``team/`` folder under ``root`` (no requirements), snapshotted by
    ``infra.code_snapshot`` and put into the code container as ``pulumi up`` puts it. The
    emulated containers hold the image and this folder, never the checkout."""
    repo = root / "repo"
    for name, source in files.items():
        (repo / "team" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, repo / "team" / name)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "team"], check=True)
    snap = snapshot("team", repo)
    upload_snapshot(vnet, storage, root, snap)
    return snap


def submit(cluster: Cluster, spec: JobSpec) -> JobRun:
    return cluster.submit(job_options(spec).as_dict(), task_options(spec).as_dict())


def run_folder(cluster: Cluster, spec: JobSpec) -> Path:
    """The run's folder on the NFS server (the share is mounted as ``shared``)."""
    relative = spec.checkpoint_path.split("/", 1)[1]
    cluster.sync_nfs()
    return cluster.nfs_export / relative


def describe(cluster: Cluster, run: JobRun) -> str:
    lines = [f"state={run.state} exit={run.exit_code} reason={run.reason} error={run.error}"]
    lines += [f"try {i}: {t}" for i, t in enumerate(run.tries)]
    lines += cluster.events[-40:]
    for node in run.nodes or cluster.nodes:
        for folder in (run.prep_dir(node), run.task_dir(node)):
            for path in sorted(folder.glob("*.txt")) if folder else ():
                lines.append(f"--- node {node.index} {path.relative_to(node.root)}:\n"
                             f"{path.read_text()[-3000:]}")  # fmt: skip
    for path in sorted((cluster.base / "logs").glob("*.agent")):
        text = path.read_text().strip()
        if text:
            lines.append(f"--- {path.name}: {text[-1500:]}")
    return "\n".join(lines)


def metrics(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def folder_logs(folder: Path, attempt: str | None = None) -> str:
    """The launchers' logs in the run folder (every attempt's, or one attempt's)."""
    root = folder / "logs" / attempt if attempt else folder / "logs"
    return "".join(p.read_text() for p in sorted(root.rglob("*.log"))) if root.is_dir() else ""


def current_attempt(folder: Path) -> str:
    return json.loads((folder / "logs" / "current.json").read_text())["attempt"]


def checkpoint_steps(folder: Path) -> list[int]:
    """The steps of the run's complete checkpoints, newest first."""
    return [step for step, _ in list_checkpoints(folder / "checkpoints")]


def worker_pids(cluster: Cluster, run: JobRun, node_index: int, script: str = "") -> list[int]:
    """The worker processes on a node: the trainer's (``python -m trainer``, not the launcher),
    or a job's own ``script`` (``python train.py``)."""
    found = []
    for pid in run.processes(cluster.nodes[node_index]):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if script:
            if script.encode() in argv:
                found.append(pid)
        elif b"-m" in argv and argv[argv.index(b"-m") + 1 : argv.index(b"-m") + 2] == [b"trainer"]:
            found.append(pid)
    return found


def in_built_image(pid: int) -> bool:
    """Whether a process on a node runs in the built image's root file system (Debian 13), not
    on this machine's (a cluster with ``image_root``)."""
    return Path(f"/proc/{pid}/root/etc/debian_version").read_text().startswith("13")


def wait_for(condition, seconds: float, what: str, cluster: Cluster, run: JobRun) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if run.finished.is_set() or time.monotonic() > deadline:
            pytest.fail(f"{what} never happened\n{describe(cluster, run)}")
        time.sleep(0.2)
