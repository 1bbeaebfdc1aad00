"""What ``infra`` declared, as the emulated Batch service and NFS server read it: the pool (its
``azure-native:batch:Pool`` inputs under Pulumi mocks) and the NFS export its server's cloud-init
leaves (owners, modes and export options)."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.batch_emulator.image import PayloadError


def lower(value: Any) -> str:
    """A REST enum's value as Batch compares it: case-insensitively."""
    return str(value or "").lower()


@dataclass(frozen=True)
class PoolSpec:
    pool_id: str
    vm_size: str
    gpus: int
    ib_ports: int  # InfiniBand HCAs (one port each) of the size
    gpu_name: str
    start_task: dict[str, Any]
    nfs_relative_mount: str | None
    task_slots_per_node: int
    inter_node_communication: bool
    identity_ids: tuple[str, ...]
    registries: tuple[str, ...]
    prefetch_images: tuple[str, ...] = ()  # containerImageNames: pulled as each node joins
    dedicated_nodes: int = 0  # nodes [0, dedicated) are dedicated, the rest Spot
    spot_nodes: int = 0
    nvme_disks: int = 0  # the size's local NVMe disks (nvme.py)

    @classmethod
    def from_declared(cls, inputs: dict[str, Any]) -> PoolSpec:
        from infra import sizes

        size_of = getattr(sizes, "size_of", sizes.SUPPORTED.__getitem__)
        size = size_of(inputs["vmSize"])
        mounts = inputs.get("mountConfiguration") or []
        nfs = next(
            (m["nfsMountConfiguration"] for m in mounts if "nfsMountConfiguration" in m), None
        )
        identities = (inputs.get("identity") or {}).get("userAssignedIdentities") or {}
        vm = inputs["deploymentConfiguration"]["virtualMachineConfiguration"]
        containers = vm.get("containerConfiguration") or {}
        registries = containers.get("containerRegistries") or []
        return cls(
            pool_id=inputs.get("poolName") or inputs.get("id"),
            vm_size=inputs["vmSize"],
            dedicated_nodes=asked_nodes(inputs, "Dedicated"),
            spot_nodes=asked_nodes(inputs, "LowPriority"),
            gpus=size.gpus,
            ib_ports=getattr(size, "ib_ports", size.gpus),
            nvme_disks=getattr(size, "nvme_disks", 0),
            gpu_name="emulated GPU",  # only what nvidia-smi prints; nothing reads it
            start_task=inputs.get("startTask") or {},
            nfs_relative_mount=nfs["relativeMountPath"] if nfs else None,
            task_slots_per_node=int(inputs.get("taskSlotsPerNode") or 1),
            inter_node_communication=lower(inputs.get("interNodeCommunication")) == "enabled",
            identity_ids=tuple(identities),
            registries=tuple(str(r.get("registryServer")) for r in registries),
            prefetch_images=tuple(str(i) for i in containers.get("containerImageNames") or ()),
        )


def asked_nodes(pool: dict[str, Any], kind: str) -> int:
    """The ``Dedicated`` or ``LowPriority`` nodes a pool asks for (fixed, or the most its formula
    sets). In a Batch-managed account low-priority nodes are Spot nodes since March 2026: "any
    use of Low-priority properties in the Azure Batch API or SDK will automatically translate
    into Spot-based compute node allocations" (Azure/Batch #196, 2026-02-25, read 2026-11-28)."""
    scale = pool.get("scaleSettings") or {}
    fixed = scale.get("fixedScale")
    if fixed:
        return int(fixed.get(f"target{kind}Nodes") or 0)
    formula = str((scale.get("autoScale") or {}).get("formula") or "")
    asked = re.search(rf"\$Target{kind}Nodes\s*=([^;]*);", formula)
    return max((int(n) for n in re.findall(r"\d+", asked.group(1))), default=0) if asked else 0


# The NFS server's root as the emulated nodes' file system sees it: a uid and gid no node
# maps (see ``Cluster.spawn``), so node root cannot override its permissions.
SERVER_ROOT = 100000


@dataclass(frozen=True)
class NfsExport:
    """The NFS server's exported tree as its cloud-init leaves it: owner, group and mode of
    each folder the setup script makes or changes (relative to the export), and the export
    options of /etc/exports."""

    folders: tuple[tuple[str, int, int, int], ...]  # (relative path, uid, gid, mode)
    options: frozenset[str]

    @property
    def root_squash(self) -> bool:
        # exports(5): root_squash is the default; no_root_squash turns it off.
        return "no_root_squash" not in self.options

    @classmethod
    def from_cloud_init(cls, user_data: str, mount_point: str) -> NfsExport:
        import yaml

        document = yaml.safe_load(user_data)
        files = {f["path"]: f["content"] for f in document.get("write_files", [])}
        exports = [
            line.split()
            for line in files.get("/etc/exports", "").splitlines()
            if line.strip() and not line.startswith("#")
        ]
        entry = next((e for e in exports if e[0] == mount_point), None)
        if entry is None:
            raise PayloadError(f"/etc/exports does not export {mount_point}")
        options = frozenset(entry[1].split("(", 1)[1].rstrip(")").split(","))
        # A fresh ext4 file system's root is root:root 0755 (mke2fs); the setup scripts that
        # runcmd executes (as root, on the server) then change the tree.
        tree: dict[str, list[int]] = {"": [0, 0, 0o755]}
        scripts = [
            files[command[0]]
            for command in document.get("runcmd", [])
            if isinstance(command, list) and command and command[0] in files
        ]
        prefix = mount_point.rstrip("/")
        for script in scripts:
            for line in script.replace("\\\n", " ").splitlines():
                try:
                    words = shlex.split(line, comments=True)
                except ValueError:
                    continue
                args = [w for w in words[1:] if not w.startswith("-")]
                paths = [a for a in args if a == prefix or a.startswith(prefix + "/")]
                if not words or not paths:
                    continue
                for path in paths:
                    relative = path[len(prefix) :].strip("/")
                    if words[0] == "mkdir":
                        parts = relative.split("/") if relative else []
                        for depth in range(1, len(parts) + 1):
                            tree.setdefault("/".join(parts[:depth]), [0, 0, 0o755])
                    elif relative in tree and words[0] == "chmod":
                        tree[relative][2] = chmod_mode(tree[relative][2], args[0])
                    elif relative in tree and words[0] == "chown":
                        owner, _, group = args[0].partition(":")
                        tree[relative][0] = _id(owner, tree[relative][0])
                        tree[relative][1] = _id(group, tree[relative][1])
                    elif relative in tree and words[0] == "chgrp":
                        tree[relative][1] = _id(args[0], tree[relative][1])
        folders = tuple(sorted((path, *values) for path, values in tree.items()))
        return cls(folders, options)  # type: ignore[arg-type]

    def create(self, root: Path) -> None:
        """The tree under ``root``, owned as on the server (its root as ``SERVER_ROOT``)."""
        for relative, uid, gid, mode in self.folders:
            folder = root / relative if relative else root
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, uid or SERVER_ROOT, gid or SERVER_ROOT)
            os.chmod(folder, mode)


def _id(name: str, default: int) -> int:
    if not name:
        return default
    if name.isdigit():
        return int(name)
    return {"root": 0, "nobody": 65534, "nogroup": 65534}.get(name, default)


def chmod_mode(mode: int, spec: str) -> int:
    """chmod(1) modes: octal, or symbolic clauses like ``a+rwx,o-w`` and ``1777``."""
    if spec.isdigit():
        return int(spec, 8)
    bits = {"r": 4, "w": 2, "x": 1}
    shift = {"u": 6, "g": 3, "o": 0}
    for clause in spec.split(","):
        who = ""
        while clause and clause[0] in "ugoa":
            who, clause = who + clause[0], clause[1:]
        targets = "ugo" if who in ("", "a") or "a" in who else who
        operator, perms = clause[0], clause[1:]
        for target in targets:
            value = sum(bits[p] for p in perms if p in bits) << shift[target]
            if operator == "+":
                mode |= value
            elif operator == "-":
                mode &= ~value
            else:
                mode = (mode & ~(7 << shift[target])) | value
        if "t" in perms:
            mode = mode | 0o1000 if operator != "-" else mode & ~0o1000
    return mode
