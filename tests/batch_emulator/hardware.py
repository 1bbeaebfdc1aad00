"""An emulated node's hardware and host files, outside its Batch tree: InfiniBand ports as sysfs
shows them, the GPU driver's ``nvidia-smi`` and the kernel's log, systemd as far as the start
task uses it, the local NVMe disks, ``/etc/hosts`` and the HPC image's NCCL topology files."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.batch_emulator.declared import PoolSpec
from tests.batch_emulator.node import Node, make_tree
from tests.batch_emulator.nvme import NvmeDisks


def make_node(node: Node, pool: PoolSpec, driver: str, nodes: Sequence[Node]) -> None:
    """A new VM of the pool: its Batch tree and mount points, its hardware, its host files."""
    make_tree(node)
    if pool.nfs_relative_mount:
        (node.mounts_dir / pool.nfs_relative_mount).mkdir(exist_ok=True)
    sysfs = _infiniband(node)
    _tools(node, pool, driver)
    # The node's /var/lib, on its OS disk: it survives a restart.
    (node.hw / "var-lib").mkdir(exist_ok=True)
    # The node's own /mnt, where the start task mounts the NVMe array; the size's local NVMe
    # disks, blank on a new VM, and the tools that assemble them.
    (node.hw / "mnt").mkdir(exist_ok=True)
    if pool.nvme_disks:
        disks = NvmeDisks(node.hw, pool.nvme_disks)
        disks.lose()
        disks.install(node.hw / "bin")
    # Each VM has its own hostname, which the VNet's DNS resolves to its private address.
    hosts = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    hosts += [f"{n.ip} {n.hostname}" for n in nodes]
    (node.hw / "hosts").write_text("\n".join(hosts) + "\n")
    opt_microsoft = node.hw / "opt-microsoft"  # the HPC image's NCCL topology files
    opt_microsoft.mkdir(parents=True, exist_ok=True)
    for name in ("ndv4-topo.xml", "ndv5-topo.xml", "ndv4/topo.xml", "ndv5/topo.xml"):
        (opt_microsoft / name).parent.mkdir(exist_ok=True)
        (opt_microsoft / name).write_text("<system version='1'></system>\n")
    for path in (node.hw, *node.hw.rglob("*")):
        if path.is_dir():
            os.chmod(path, 0o755)
    for path in sysfs.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o444)
    os.chmod(sysfs, 0o755)


def _infiniband(node: Node) -> Path:
    """InfiniBand HCAs as sysfs shows them (``node.ib_ports``); the folder."""
    sysfs = node.hw / "sys-infiniband"
    shutil.rmtree(sysfs, ignore_errors=True)
    for device, (state, link_layer) in node.ib_ports.items():
        port = sysfs / device / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(f"{state}\n")
        (port / "link_layer").write_text(f"{link_layer}\n")
        up = "ACTIVE" in state
        (port / "phys_state").write_text("5: LinkUp\n" if up else "3: Disabled\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    return sysfs


def _tools(node: Node, pool: PoolSpec, driver: str) -> None:
    """The node's own tools in ``hw/bin``: nvidia-smi, dmesg, systemd-run and systemctl."""
    # The driver's tools: on the node, and in containers, where Batch enables the GPUs
    # (batch-docker-container-workloads.md) and NVIDIA's runtime puts them on PATH.
    (node.hw / "bin").mkdir(parents=True, exist_ok=True)
    smi = node.hw / "bin" / "nvidia-smi"
    smi.write_text(_nvidia_smi(pool.gpus, pool.gpu_name, driver))
    smi.chmod(0o755)
    # The kernel's log since boot, as the node's admin reads it with dmesg: a file, which a
    # test may add to while the node runs and a restart empties.
    node.kmsg.write_text(node.kernel_log)
    dmesg = node.hw / "bin" / "dmesg"
    dmesg.write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(node.kmsg))}\n")
    dmesg.chmod(0o755)
    # systemd, as far as the start task uses it: `systemd-run` records a transient unit,
    # which the emulator starts once the start task succeeded (Batch nodes run systemd; a
    # unit lives outside the start task's processes until the node restarts), and
    # `systemctl reboot` asks the platform to restart the VM.
    (node.hw / "units").mkdir(exist_ok=True)
    for tool in ("systemd-run", "systemctl"):
        stub = node.hw / "bin" / tool
        stub.write_text(_SYSTEMD_STUB.format(python=sys.executable, hw=str(node.hw)))
        stub.chmod(0o755)


# systemd-run (--unit, --setenv and the command; the other options change nothing here) and
# systemctl (stop: units end when the node restarts, and the emulator reruns the start task
# only then; reboot).
_SYSTEMD_STUB = """#!{python}
import json, os, sys
from pathlib import Path
hw, tool, args = Path({hw!r}), os.path.basename(sys.argv[0]), sys.argv[1:]
if tool == "systemctl":
    if args[:1] == ["reboot"]:
        (hw / "reboot-requested").touch()
    sys.exit(0)
name, env = "", {{}}
while args and args[0].startswith("--"):
    option = args.pop(0)
    if option.startswith("--unit="):
        name = option.split("=", 1)[1]
    elif option.startswith("--setenv="):
        key, _, value = option.split("=", 1)[1].partition("=")
        env[key] = value
(hw / "units" / (name + ".json")).write_text(json.dumps({{"name": name, "env": env, "argv": args}}))
"""


def _nvidia_smi(gpus: int, name: str, driver: str) -> str:
    """``nvidia-smi`` as the node's driver answers ``-L`` and ``--query-gpu=...``."""
    listing = "\n".join(
        f"GPU {i}: NVIDIA {name} (UUID: GPU-{i:08d}-0000-0000-0000-000000000000)"
        for i in range(gpus)
    )
    # A healthy GPU: no uncorrectable ECC error since boot, no row remapping pending or failed.
    values = {
        "driver_version": driver,
        "name": f"NVIDIA {name}",
        "count": str(gpus),
        "ecc.errors.uncorrected.volatile.total": "0",
    }
    if gpus == 0:
        # The HPC image's driver on a VM without GPUs: nvidia-smi is there and fails.
        return (
            "#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the "
            "NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.'\n"
            "exit 9\n"
        )
    return f"""#!/bin/bash
# Emulated nvidia-smi: {gpus} x NVIDIA {name}, driver {driver}. Output is written at once, as
# the real tool's is (a reader that stops early does not make it fail).
listing='{listing}'
case "$1" in
-L|--list-gpus) [ -n "$listing" ] && printf '%s\\n' "$listing" ;;
--query-gpu=*)
  IFS=, read -ra fields <<< "${{1#--query-gpu=}}"
  out=""
  for ((i = 0; i < {gpus}; i++)); do
    row=""
    for field in "${{fields[@]}}"; do
      case "$field" in
{chr(10).join(f"        {k}) value='{v}' ;;" for k, v in values.items())}
        index) value="$i" ;;
        *) echo "Field \\"$field\\" is not a valid field to query." >&2; exit 2 ;;
      esac
      row="${{row:+$row, }}$value"
    done
    out+="$row"$'\\n'
  done
  printf '%s' "$out" ;;
--query-remapped-rows=*)
  for ((i = 0; i < {gpus}; i++)); do printf '00000000:%02X:00.0, 0, 0\n' $((i + 24)); done ;;
*) echo "NVIDIA-SMI {driver}    GPUs: {gpus}" ;;
esac
"""
