"""What a process on an emulated node sees of the file system: the mount operations the agent
applies in its mount namespace (the node's own mounts, the node's ``/mnt`` and ``/var/lib``, the
image's code, what a container must not see) and which node folder a ``-v HOST`` binds."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.batch_emulator import REPO
from tests.batch_emulator.image import PayloadError
from tests.batch_emulator.node import Node

if TYPE_CHECKING:
    from tests.batch_emulator.cluster import Cluster


def node_mounts(cluster: Cluster, node: Node, stage: Path) -> list[dict[str, Any]]:
    """What every process on the node sees: its /etc/hosts; the NFS share where the pool
    mounts it (NFSMountConfiguration.relativeMountPath: "All file systems are mounted
    relative to the Batch mounts directory, accessible via the AZ_BATCH_NODE_MOUNTS_DIR
    environment variable"; virtual-file-mount.md: mounted "when a compute node joins the
    pool", so before the start task); its InfiniBand devices in /sys/class/infiniband."""
    ops: list[dict[str, Any]] = [
        {"op": "bind", "src": str(node.hw / "hosts"), "dst": "/etc/hosts", "ro": True}
    ]
    if cluster.pool.nfs_relative_mount:
        target = node.mounts_dir / cluster.pool.nfs_relative_mount
        share = (
            cluster.nfs_export if cluster.nfs_views is None else cluster.nfs_views.path(node.index)
        )
        ops.append({"op": "bind", "src": str(share), "dst": str(target)})
    ops.append(
        {
            "op": "sys_class",
            "stage": str(stage / "sys"),
            "entries": {"infiniband": str(node.hw / "sys-infiniband")},
        }
    )
    return ops


def admin_mounts(cluster: Cluster, node: Node, stage: Path) -> list[dict[str, Any]]:
    """What the node's own processes (the start task, systemd's units) see: the node's
    mounts, its /var/lib and its /mnt, with what is mounted under it in this boot."""
    var_lib = {"op": "bind", "src": str(node.hw / "var-lib"), "dst": "/var/lib"}
    return [*node_mounts(cluster, node, stage), var_lib, *_mnt(cluster, node)]


def _mnt(cluster: Cluster, node: Node) -> list[dict[str, Any]]:
    """The node's /mnt, and the file systems the node mounted under it since it booted."""
    ops: list[dict[str, Any]] = [{"op": "bind", "src": str(node.hw / "mnt"), "dst": "/mnt"}]
    if not cluster.pool.nvme_disks:
        return ops
    for point in json.loads((cluster.nvme(node).root / "mounts.json").read_text()):
        data = cluster.nvme(node).mounted(point)
        ops += [{"op": "mkdir", "dst": point}, {"op": "bind", "src": str(data), "dst": point}]
    return ops


def host_path(cluster: Cluster, node: Node, host: str) -> Path:
    """What a container's ``-v HOST:...`` binds on the node: the HPC image's NCCL topology
    files; under /mnt, the node's own /mnt, or the file system mounted there (Docker makes
    a missing source an empty folder, docs.docker.com, bind mounts with -v); else HOST."""
    if host == "/opt/microsoft":
        return node.hw / "opt-microsoft"
    if not host.startswith("/mnt/"):
        return Path(host)
    data = cluster.nvme(node).mounted(host) if cluster.pool.nvme_disks else None
    if data is not None:
        return data
    folder = node.hw / "mnt" / host.removeprefix("/mnt/")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def image_code(cluster: Cluster, stage: Path) -> list[dict[str, Any]]:
    """The image's code and nothing else of the checkout: ``trainer/`` where the image
    copies it (docker/Dockerfile: ``COPY trainer /opt/trainer/trainer`` under its ``ENV
    PYTHONPATH=/opt/trainer``), and the checkout reduced to its ``.venv`` (the image's
    /opt/venv, whose console scripts name it): examples/, tests/, infra/ are not there."""
    pythonpath = cluster.image.env_dict().get("PYTHONPATH", "").split(":")[0]
    if not pythonpath:
        raise PayloadError("the image sets no PYTHONPATH: where does it keep trainer/?")
    target = str(Path(pythonpath) / "trainer")
    return [
        {"op": "mkdir", "dst": target},
        {"op": "bind", "src": str(REPO / "trainer"), "dst": target, "ro": True},
        *hide_except(REPO, [(REPO / ".venv", True)], stage),
    ]


def hide_except(root: Path, keep: list[tuple[Path, bool]], stage: Path) -> list[dict[str, Any]]:
    """Mount operations that make ``root`` an empty folder except for ``keep`` (re-mounted at
    the same paths, read-only where asked)."""
    ops: list[dict[str, Any]] = [{"op": "tmpfs", "dst": str(stage)}]
    for i, (path, _) in enumerate(keep):
        ops.append({"op": "bind", "src": str(path), "dst": str(stage / str(i))})
    ops.append({"op": "tmpfs", "dst": str(root)})
    for i, (path, read_only) in enumerate(keep):
        ops.append({"op": "mkdir", "dst": str(path)})
        ops.append({"op": "bind", "src": str(stage / str(i)), "dst": str(path), "ro": read_only})
    ops.append({"op": "umount", "dst": str(stage)})
    return ops


def readable_runtime(stage: Path) -> list[dict[str, Any]]:
    """The interpreter the venv links to and this checkout (its venv and trainer/ are the
    image's: ``image_code``), reachable by any uid as in the image: a folder above
    them that only root may enter (e.g. /root) is replaced, in the container, by one that holds
    just them."""
    base = Path(sys.base_prefix).resolve()
    ops: list[dict[str, Any]] = []
    for target in (base, REPO):
        for ancestor in reversed(target.parents):
            if ancestor == Path("/"):
                continue
            mode = ancestor.stat().st_mode
            if not mode & stat.S_IXOTH:
                ops += hide_except(ancestor, [(target, True)], stage / ancestor.name)
                break
    return ops
