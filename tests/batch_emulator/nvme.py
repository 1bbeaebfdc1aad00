"""A node's local NVMe disks and the tools a start task assembles them with: stand-ins for the
``/dev/nvme*n1`` disks and for ``lsblk``, ``mdadm``, ``mkfs.xfs``, ``mount`` and ``mountpoint``
that answer the calls ``infra/node_checks.py`` makes as the real tools answer them (their
messages and exit codes from util-linux's and mdadm's manual pages), and refuse any other call
loudly. The state lives in files (``NvmeDisks.root``), so the tools, the emulator and the tests
share it: each disk's RAID superblock, the arrays the running kernel has assembled, the file
system on each array and what is mounted where.

What the platform does to the disks is the emulator's (``vm_events.py`` and ``hardware.py``):
a restart keeps them and the kernel assembles the array it finds on them again (``boot``), a
Preempt, Redeploy or Terminate gives the node blank ones (``lose``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

# The other block devices lsblk lists on an ND v5 node: the OS disk and the temporary disk,
# which are SCSI disks on these sizes (enable-nvme-temp-faqs: v5 sizes' local disks "are on
# the SCSI interface"), so no glob over /dev/nvme* can take them for a local NVMe disk.
OTHER_DISKS = ("/dev/sda", "/dev/sdb")


class NvmeDisks:
    """``count`` local NVMe disks of one node, under ``hw/nvme``."""

    def __init__(self, hw: Path, count: int) -> None:
        self.root = hw / "nvme"
        self.mnt = hw / "mnt"  # the node's /mnt, where the start task mounts the array
        self.count = count

    @property
    def names(self) -> list[str]:
        return [f"/dev/nvme{k}n1" for k in range(self.count)]

    def _disk(self, name: str) -> Path:
        return self.root / "disks" / Path(name).name

    def _state(self, name: str) -> dict:
        path = self.root / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def lose(self) -> None:
        """Blank disks and a kernel that has assembled and mounted nothing (a new VM)."""
        if self.root.exists():
            self._unmount()
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "disks").mkdir(parents=True)
        (self.root / "fs").mkdir()
        for name in self.names:
            self._disk(name).write_text("")
        self.boot()

    def boot(self) -> None:
        """A restart: nothing mounted (no fstab entry), and the array whose superblocks are on
        the disks assembled again by the kernel's udev rule (mdadm(8), ``--incremental``: the
        disks of an array mdadm.conf does not name are assembled when they appear), under a
        number counted down from 127, not the name it was created with."""
        arrays: dict[str, dict] = {}
        found: dict[str, list[str]] = {}
        for name in self.names:
            block = self._disk(name).read_text()
            if block:
                found.setdefault(json.loads(block)["uuid"], []).append(name)
        for number, (uuid, members) in enumerate(sorted(found.items())):
            wanted = json.loads(self._disk(members[0]).read_text())["devices"]
            if len(members) == wanted:  # RAID0 starts only with every member
                arrays[f"/dev/md{127 - number}"] = {"uuid": uuid, "members": sorted(members)}
        (self.root / "arrays.json").write_text(json.dumps(arrays))
        self._unmount()

    def _unmount(self) -> None:
        """Every mount point back to the empty folder it was before the mount."""
        for point in self._state("mounts"):
            link = self.mnt / point.removeprefix("/mnt/")
            if link.is_symlink():
                link.unlink()
                link.mkdir()
        (self.root / "mounts.json").write_text("{}")

    def arrays(self) -> dict[str, dict]:
        """The running kernel's arrays: device -> its uuid and members."""
        return self._state("arrays")

    def mounted(self, point: str) -> Path | None:
        """The file system's folder mounted at ``point`` now, or None."""
        device = self._state("mounts").get(point)
        if device is None:
            return None
        return self.root / "fs" / self.arrays()[device]["uuid"] / "data"

    def install(self, bin_dir: Path) -> None:
        """The tools, on the node's PATH."""
        for tool in ("lsblk", "mdadm", "mkfs.xfs", "mount", "mountpoint"):
            stub = bin_dir / tool
            stub.write_text(
                _TOOLS.format(python=sys.executable, root=str(self.root), count=self.count)
            )
            stub.chmod(0o755)


# One program for every tool, by the name it is called as. Each answers what the start task
# asks; anything else exits 2 naming it, so a script that starts to use another form is seen.
_TOOLS = """#!{python}
import json, os, sys, uuid
from pathlib import Path
root, count = Path({root!r}), {count}
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
disks = [f"/dev/nvme{{k}}n1" for k in range(count)]
other = {other!r}

def load(name):
    path = root / (name + ".json")
    return json.loads(path.read_text()) if path.exists() else {{}}

def save(name, value):
    (root / (name + ".json")).write_text(json.dumps(value))

def block(disk):
    text = (root / "disks" / Path(disk).name).read_text()
    return json.loads(text) if text else None

def holder(disk):
    return next((md for md, a in load("arrays").items() if disk in a["members"]), None)

def die(code, *lines):
    print(*lines, sep="\\n", file=sys.stderr)
    sys.exit(code)

def unsupported():
    die(2, f"emulated {{tool}}: unsupported call {{args}}")

if tool == "lsblk":
    if args == ["-dnpo", "NAME,TYPE"]:
        print("\\n".join(f"{{d}} disk" for d in [*other, *disks]))
    elif args[:2] == ["-lnpo", "NAME,TYPE"] and len(args) == 3:
        if args[2] not in disks:
            die(32, f"lsblk: {{args[2]}}: not a block device")
        print(f"{{args[2]}} disk")
        if holder(args[2]):
            print(f"{{holder(args[2])}} raid0")
    else:
        unsupported()
elif tool == "mdadm" and args[:1] == ["--examine"] and len(args) == 2:
    found = block(args[1]) if args[1] in disks else None
    if found is None:
        die(1, f"mdadm: No md superblock detected on {{args[1]}}.")
    print(f"{{args[1]}}:\\n          Magic : a92b4efc\\n     Array UUID : {{found['uuid']}}")
    print(f"     Raid Level : raid0\\n   Raid Devices : {{found['devices']}}")
elif tool == "mdadm" and args[:1] == ["--assemble"] and len(args) >= 3:
    md, members, arrays = args[1], args[2:], load("arrays")
    if md in arrays:
        die(1, f"mdadm: {{md}} is already in use.")
    busy = [d for d in members if holder(d)]
    if busy:
        die(1, f"mdadm: Found some drive for an array that is already active: {{busy[0]}}")
    blocks = [block(d) if d in disks else None for d in members]
    if None in blocks:
        die(1, f"mdadm: no recogniseable superblock on {{members[blocks.index(None)]}}")
    ids = {{b["uuid"] for b in blocks}}
    if len(ids) != 1 or len(members) != blocks[0]["devices"]:
        die(1, f"mdadm: {{md}} assembled from {{len(members)}} drives - "
               "not enough to start the array.")
    arrays[md] = {{"uuid": ids.pop(), "members": sorted(members)}}
    save("arrays", arrays)
    print(f"mdadm: {{md}} has been started with {{len(members)}} drives.", file=sys.stderr)
elif tool == "mdadm" and args[:1] == ["--create"] and len(args) >= 3:
    md, rest, options, members = args[1], args[2:], {{}}, []
    while rest:
        word = rest.pop(0)
        if word.startswith("--") and "=" in word:
            key, _, value = word.partition("=")
            options[key] = value
        elif word in ("--level", "--raid-devices"):
            options[word] = rest.pop(0)
        elif word in ("--run", "--force"):
            options[word] = True
        elif word.startswith("-"):
            unsupported()
        else:
            members.append(word)
    if options.get("--level") not in ("0", "raid0"):
        unsupported()
    wanted = int(options.get("--raid-devices", 0))
    if len(members) < wanted:
        die(2, "mdadm: You haven't given enough devices (real or missing) to create this array")
    if len(members) > wanted:
        die(2, f"mdadm: You have listed more devices ({{len(members)}}) "
               f"than are in the array({{wanted}})!")
    for disk in members:
        if disk not in disks:
            die(1, f"mdadm: cannot open {{disk}}: No such file or directory")
        if holder(disk):
            die(1, f"mdadm: cannot open {{disk}}: Device or resource busy")
    if md in load("arrays"):
        die(1, f"mdadm: {{md}} is already in use.")
    if any(block(d) for d in members) and "--run" not in options:
        # mdadm asks "Continue creating array?" and, with no terminal to answer, aborts.
        die(1, f"mdadm: {{members[0]}} appears to be part of a raid array:",
            "mdadm: create aborted.")
    new = str(uuid.uuid4())
    for index, disk in enumerate(members):
        (root / "disks" / Path(disk).name).write_text(json.dumps(
            {{"uuid": new, "devices": wanted, "index": index}}))
    arrays = load("arrays")
    arrays[md] = {{"uuid": new, "members": sorted(members)}}
    save("arrays", arrays)
    print(f"mdadm: array {{md}} started.", file=sys.stderr)
elif tool == "mdadm":
    unsupported()
elif tool == "mkfs.xfs":
    if args[:1] != ["-f"] or len(args) != 2:
        unsupported()
    array = load("arrays").get(args[1])
    if array is None:
        die(1, f"mkfs.xfs: cannot open {{args[1]}}: No such file or directory")
    fs = root / "fs" / array["uuid"]
    import shutil
    shutil.rmtree(fs, ignore_errors=True)
    (fs / "data").mkdir(parents=True)
    (fs / "type").write_text("xfs")
    print(f"meta-data={{args[1]}}              isize=512    agcount=32")
elif tool == "mount":
    if len(args) != 2 or args[0].startswith("-"):
        unsupported()
    device, point, mounts = args[0], args[1], load("mounts")
    array = load("arrays").get(device)
    if array is None:
        die(32, f"mount: {{point}}: special device {{device}} does not exist.")
    if not os.path.isdir(point):
        die(32, f"mount: {{point}}: mount point does not exist.")
    if point in mounts:
        die(32, f"mount: {{point}}: {{mounts[point]}} already mounted on {{point}}.")
    data = root / "fs" / array["uuid"] / "data"
    if not data.is_dir():
        die(32, f"mount: {{point}}: wrong fs type, bad option, bad superblock on {{device}}, "
                "missing codepage or helper program, or other error.")
    # Shown as a link from the mount point to the file system's folder: the emulated node's
    # root may not mount (its user namespace); the emulator binds it for later processes.
    if any(Path(point).iterdir()):
        die(2, f"emulated mount: {{point}} is not empty")
    Path(point).rmdir()
    Path(point).symlink_to(data)
    mounts[point] = device
    save("mounts", mounts)
elif tool == "mountpoint":
    if len(args) != 2 or args[0] != "-q":
        unsupported()
    sys.exit(0 if args[1] in load("mounts") else 32)
""".replace("{other!r}", repr(OTHER_DISKS))
