"""A job's task process on an emulated node, mostly a container as Batch creates it (``docker
create [Batch's options] [containerRunOptions] IMAGE COMMAND``, then start): the container
settings checked against the pool, the Batch folders Batch binds, the image's file system and
the process's environment; a task without container settings runs on the node itself."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.batch_emulator import REPO
from tests.batch_emulator.declared import lower
from tests.batch_emulator.image import (
    DEFAULT_PATH,
    NVIDIA_ENTRYPOINT,
    PayloadError,
    RunOptions,
    batch_create_args,
    container_argv,
    docker_create_options,
)
from tests.batch_emulator.mounts import (
    hide_except,
    host_path,
    image_code,
    node_mounts,
    readable_runtime,
)
from tests.batch_emulator.node import Node
from tests.batch_emulator.processes import Proc
from tests.batch_emulator.tasks import command_argv, user_of

if TYPE_CHECKING:
    from tests.batch_emulator.cluster import Cluster

# path for multi-instances task to shared their files" (Batch REST reference; the SDKs' enum
# says the same), so both readings run: "node", the node's shared folder
# (AZ_BATCH_NODE_SHARED_DIR, batch-compute-node-environment-variables.md), or "task", the task's
# own shared folder (AZ_BATCH_TASK_SHARED_DIR of a multi-instance task; for another task, its
# own folder), under which AZ_BATCH_NODE_SHARED_DIR is not in the container at all.
SHARED_READINGS = ("node", "task")


def _check_container(cluster: Cluster, settings: dict[str, Any]) -> None:
    image = settings.get("imageName", "")
    registry = (settings.get("registry") or {}).get("registryServer")
    if registry and not image.startswith(f"{registry}/"):
        raise PayloadError(f"imageName {image} is not in registry {registry}")
    identity = ((settings.get("registry") or {}).get("identityReference") or {}).get("resourceId")
    if identity and identity not in cluster.pool.identity_ids:
        raise PayloadError(
            f"registry identity {identity} is not one of the pool's identities "
            f"{list(cluster.pool.identity_ids)}"
        )


def _bind_sources(cluster: Cluster, node: Node, task_dir: Path, job_prep_dir: Path | None) -> dict:
    # ContainerHostDataPath (Batch REST): each name is one of the node's Batch folders,
    # mounted at the same path; "Shared" under the cluster's reading (SHARED_READINGS).
    # The emulator's AZ_BATCH_TASK_SHARED_DIR is the task's folder (see ``job_run``).
    sources = {
        "task": task_dir,
        "shared": node.shared_dir if cluster.shared == "node" else task_dir,
        "startup": node.startup_dir,
        "vfsmounts": node.mounts_dir,
        "applications": node.root / "applications",
    }
    if job_prep_dir is None:
        # A JobPrep mount on a job without a preparation task: Batch does not say what it
        # mounts; Docker creates a missing bind source empty, so the emulator does too.
        job_prep_dir = task_dir.parent / "jobpreparation"
        job_prep_dir.mkdir(parents=True, exist_ok=True)
    sources["jobprep"] = job_prep_dir
    return sources


def _batch_binds(
    cluster: Cluster,
    node: Node,
    settings: dict[str, Any],
    task_dir: Path,
    job_prep_dir: Path | None,
) -> list[tuple[Path, bool]]:
    """The Batch folders Batch binds into a task's container, each at its own path."""
    # BatchTaskContainerSettings.containerHostBatchBindMounts: "If this array is null or be
    # not present, container task will mount ... AZ_BATCH_NODE_ROOT_DIR in Linux. It won't
    # mount any data paths into container if this array is set as empty."
    entries = settings.get("containerHostBatchBindMounts")
    if entries is None:
        return [(node.root, False)]
    sources = _bind_sources(cluster, node, task_dir, job_prep_dir)
    keep: list[tuple[Path, bool]] = []
    for entry in entries:
        source = sources.get(lower(entry.get("source")))
        if source is None:
            raise PayloadError(f"containerHostBatchBindMounts: no {entry.get('source')}")
        if any(source == kept for kept, _ in keep):
            continue  # "Shared" read as the task's folder: Batch mounts a folder once
        keep.append((source, bool(entry.get("isReadOnly"))))
    return keep


def _container_mounts(
    cluster: Cluster,
    node: Node,
    settings: dict[str, Any],
    task_dir: Path,
    job_prep_dir: Path | None,
    options: RunOptions,
    stage: Path,
) -> list[dict[str, Any]]:
    """The container's file system: the node's mounts, the Batch folders Batch binds, the
    image's, and the run options' volumes."""
    keep = _batch_binds(cluster, node, settings, task_dir, job_prep_dir)
    if cluster.image_root is not None:
        return _built_image_mounts(cluster, node, keep, options, stage)
    ops = node_mounts(cluster, node, stage)
    # Everything of the Batch tree that is not mounted is absent in the container, and so
    # are the other emulated nodes' trees.
    ops += hide_except(cluster.base / "nodes", keep, stage / "batch")
    # The image's file system: the image's /opt (its venv, the CUDA base's entrypoint),
    # the interpreter the venv links to, readable by any user as in the image.
    under_opt = [
        (path, True)
        for path in (REPO.resolve(), Path(sys.base_prefix).resolve())
        if Path("/opt") in path.parents
    ]
    ops += hide_except(Path("/opt"), under_opt, stage / "opt")
    ops.append({"op": "mkdir", "dst": "/opt/venv"})
    ops.append({"op": "bind", "src": str(REPO / ".venv"), "dst": "/opt/venv", "ro": True})
    ops.append({"op": "mkdir", "dst": str(Path(NVIDIA_ENTRYPOINT).parent)})
    ops.append(
        {
            "op": "file",
            "dst": NVIDIA_ENTRYPOINT,
            "content": '#!/bin/bash\n# NVIDIA CUDA banner omitted\nexec "$@"\n',
            "mode": 0o755,
        }
    )
    ops += readable_runtime(stage / "runtime")
    ops += image_code(cluster, stage / "checkout")
    if any(container.startswith("/mnt/") for _, container, _ in options.volumes):
        ops.append({"op": "bind", "src": str(node.hw / "mnt"), "dst": "/mnt"})
    return ops + _volumes(cluster, node, options, lambda path: Path(path).exists())


def _built_image_mounts(
    cluster: Cluster,
    node: Node,
    keep: list[tuple[Path, bool]],
    options: RunOptions,
    stage: Path,
) -> list[dict[str, Any]]:
    """The container's file system when the cluster runs the built image (``image_root``):
    the image's own root, writable in a layer of the container's, and in it, at their node
    paths, the node's mounts, the Batch folders Batch binds, the driver's tools and the
    emulated storage's certificate, and the run options' volumes."""
    assert cluster.image_root is not None
    ops: list[dict[str, Any]] = [
        {
            "op": "image_root",
            "image": str(cluster.image_root),
            "root": str(stage / "root"),
            "upper": str(stage / "upper"),
            "work": str(stage / "work"),
        }
    ]
    # Each inside the root (the agent's image_root); the Batch folders first, as the node's
    # mounts (the share under AZ_BATCH_NODE_MOUNTS_DIR) lie inside the Batch tree.
    node_files = [(node.hw / "bin", True), (cluster.storage.ca_file.parent, True)]
    for path, read_only in [*keep, *node_files]:
        ops.append({"op": "mkdir", "dst": str(path)})
        ops.append({"op": "bind", "src": str(path), "dst": str(path), "ro": read_only})
    ops += node_mounts(cluster, node, stage)
    in_image = cluster.image_root
    return ops + _volumes(
        cluster, node, options, lambda path: (in_image / path.lstrip("/")).exists()
    )


def _volumes(
    cluster: Cluster, node: Node, options: RunOptions, exists: Callable[[str], bool]
) -> list[dict[str, Any]]:
    """The run options' ``-v HOST:CONTAINER`` volumes; ``exists``: whether the container has
    the mount point (one under /opt or /mnt is made)."""
    ops: list[dict[str, Any]] = []
    for host, container, read_only in options.volumes:
        source = host_path(cluster, node, host)
        if not source.exists():
            raise PayloadError(f"-v {host}: not on the node (Docker would create it empty)")
        if not container.startswith(("/opt/", "/mnt/")) and not exists(container):
            cluster.log(f"node {node.index}: volume {container} not emulated (no mount point)")
            continue
        ops.append({"op": "mkdir", "dst": container})
        ops.append({"op": "bind", "src": str(source), "dst": container, "ro": read_only})
    return ops


def run_container(
    cluster: Cluster,
    node: Node,
    name: str,
    *,
    task: dict[str, Any],
    command_line: str,
    task_dir: Path,
    job_prep_dir: Path | None,
    env: dict[str, str],
    stdout: Path,
    stderr: Path,
    keep_alive: bool,
) -> Proc:
    """A container task: ``docker create [options] IMAGE COMMAND`` then start, as Batch
    does (batch-docker-container-workloads.md); the process runs as the task's user
    ("For Linux, Batch will map the user/group permission to the container")."""
    settings = task["containerSettings"]
    _check_container(cluster, settings)
    user = user_of(task.get("userIdentity"))
    image_default = lower(settings.get("workingDirectory")) == "containerimagedefault"
    binds = _batch_binds(cluster, node, settings, task_dir, job_prep_dir)
    options = _create_options(cluster, settings, user, image_default, env, binds)
    for device in options.devices:
        if device != "/dev/infiniband":  # the HPC image's RDMA devices exist on IB sizes
            raise PayloadError(f"--device {device}: not on the node")
    argv = container_argv(cluster.image, command_line, options.entrypoint)
    if not argv:
        raise PayloadError("no command: empty command line and the image has no CMD")
    workdir = (
        Path(cluster.image.workdir or "/")
        if image_default
        else Path(env["AZ_BATCH_TASK_WORKING_DIR"])
    )
    if options.workdir:
        workdir = Path(options.workdir)
    container_env = _container_env(cluster, node, options, env)
    stage = cluster.base / "stage" / name
    stage.mkdir(parents=True, exist_ok=True)
    mounts = _container_mounts(cluster, node, settings, task_dir, job_prep_dir, options, stage)
    return cluster.spawn(
        node,
        name,
        argv=argv,
        env=container_env,
        cwd=workdir,
        user=user,
        stdout=stdout,
        stderr=stderr,
        mounts=mounts,
        rlimits=options.ulimits,
        keep_alive=keep_alive,
        new_ipc=options.ipc != "host",
        # Without host networking the container would get its own address on a Docker
        # bridge, unreachable from the other nodes; the emulator gives it no network.
        new_net=options.network != "host",
    )


def _create_options(
    cluster: Cluster,
    settings: dict[str, Any],
    user: tuple[int, int],
    image_default: bool,
    env: dict[str, str],
    binds: list[tuple[Path, bool]],
) -> RunOptions:
    """Batch's own ``docker create`` arguments and the run options, checked together."""
    batch_args = batch_create_args(
        gpu_pool=cluster.pool.gpus > 0,
        user=user,
        workdir=None if image_default else env["AZ_BATCH_TASK_WORKING_DIR"],
        env=env,
        binds=[(str(path), ro) for path, ro in binds],
    )
    return docker_create_options(batch_args, settings.get("containerRunOptions"))


def _container_env(
    cluster: Cluster, node: Node, options: RunOptions, env: dict[str, str]
) -> dict[str, str]:
    """The container's environment: the image's, the run options' and the task's variables."""
    image_env = cluster.image.env_dict()
    container_env = {
        **image_env,
        # The GPUs Batch enables come with the driver's tools on PATH.
        "PATH": f"{node.hw / 'bin'}:{image_env.get('PATH', DEFAULT_PATH)}",
        # Docker sets HOME from the image's /etc/passwd; the task uid is not in it.
        "HOME": "/",
        "HOSTNAME": node.hostname,  # --network host: the node's hostname
        **options.env,
        # "All task environment variables are mapped into the container".
        **env,
        # The emulated storage's TLS certificate is a private one the node trusts.
        "REQUESTS_CA_BUNDLE": str(cluster.storage.ca_file),
    }
    if not cluster.vnet.isolated:
        container_env["AZURE_POD_IDENTITY_AUTHORITY_HOST"] = node.imds_endpoint
        container_env["AZURE_IMDS_URL"] = node.imds_endpoint
    return container_env


def run_task_process(
    cluster: Cluster,
    node: Node,
    name: str,
    task: dict[str, Any],
    command_line: str,
    task_dir: Path,
    job_prep_dir: Path | None,
    env: dict[str, str],
    out_dir: Path,
    keep_alive: bool,
    prefix: str = "",
) -> Proc:
    """A job's task process (a job preparation's, a coordination or an application command):
    in the task's container, or on the node itself when it has no container settings."""
    stdout, stderr = out_dir / f"{prefix}stdout.txt", out_dir / f"{prefix}stderr.txt"
    if task.get("containerSettings"):
        return run_container(
            cluster,
            node,
            name,
            task=task,
            command_line=command_line,
            task_dir=task_dir,
            job_prep_dir=job_prep_dir,
            env=env,
            stdout=stdout,
            stderr=stderr,
            keep_alive=keep_alive,
        )
    stage = cluster.base / "stage" / name
    stage.mkdir(parents=True, exist_ok=True)
    return cluster.spawn(
        node,
        name,
        argv=command_argv(command_line),
        env={**env, "PATH": f"{node.hw / 'bin'}:{DEFAULT_PATH}"},
        cwd=Path(env["AZ_BATCH_TASK_WORKING_DIR"]),
        user=user_of(task.get("userIdentity")),
        stdout=stdout,
        stderr=stderr,
        mounts=node_mounts(cluster, node, stage),
        keep_alive=keep_alive,
    )
