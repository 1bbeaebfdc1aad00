"""Each emulated node's own, incoherent view of the NFS export (nfs(5) attribute and lookup
caching), the hard reading where a client's caches leave it open: every new, replaced or removed
entry another node made reaches a node after a random delay up to ``bound``, whether or not the
node looked the name up before; the node's own changes it sees at once and they reach the server
(the truth) at once; content written in place is shared at once (close-to-open). Why, and how
it is built: the comment below."""

from __future__ import annotations

import itertools
import os
import random
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# Why: an NFS client is not a window onto the server's folder. nfs(5) ("DATA AND METADATA
# COHERENCE", "Directory entry caching"; nfs-utils utils/mount/nfs.man) documents that the Linux
# client caches file attributes for acregmin..acregmax (3..60 s by default) and directory attributes
# for acdirmin..acdirmax (30..60 s), and with ``lookupcache=all`` (the default) trusts both positive
# and negative LOOKUP results "until their parent directory's cached attributes expire": a file
# another client created can stay invisible, a file it replaced (rename over the name, as
# ``trainer.common.files.open_atomic`` does) can still resolve to the old file, for up to a minute.
# Our pools mount with none of ac/actimeo/acdirmax/lookupcache set (``infra/nfs.py``:
# "vers=4.1,hard, nconnect=8,..." for the VM, "vers=4,minorversion=1,sec=sys,nconnect=4" for Azure
# Files), so those defaults apply. What nfs(5) does guarantee, close-to-open consistency, holds here
# too: a file changed in place (the same inode) is the same file on every node.
#
# How: each node's view is a folder of its own mirroring the export: folders copied (owner,
# mode), files hard links to the export's inodes, so content written in place is shared at once
# (close-to-open) while a name another node created, replaced or removed is updated in the view
# only when its delay has passed. A sync pass pushes what the node did in its view (new inodes,
# removals, new folders, mode changes) to the truth at once, then pulls the truth's changes whose
# delay is over. The delays are drawn from the seed, the node, the path and how many times it
# changed, so a seed replays the same delays; ``sync(now)`` takes the clock from the caller, so
# unit tests drive it with a fake one.

# Each node sees the share through its own view: another node's new, replaced or removed entries
# reach it up to this many seconds late (a real client: up to acdirmax, a minute). Scaled down
# so tests stay short: every try waits out a few of these delays (the token, the outcomes), so
# most clusters take a short bound, which still leaves each wait seconds longer than the
# launchers' polls; one full run keeps the long one (NFS_VIEW_LONG_SECONDS).
NFS_VIEW_SECONDS = 3.0
NFS_VIEW_LONG_SECONDS = 10.0

# What a path is in a tree: ("f", inode) for a file (or symlink), ("d", (mode, uid, gid)) for a
# folder. Two trees agree on a path when these are equal.
Entry = tuple[str, object]


def _walk(root: Path) -> dict[str, Entry]:
    """Every path under ``root`` (relative, "" excluded), what it is (``Entry``)."""
    found: dict[str, Entry] = {}
    for folder, dirs, files in os.walk(root):
        base = os.path.relpath(folder, root)
        for name in dirs + files:
            rel = name if base == "." else f"{base}/{name}"
            try:
                info = os.lstat(root / rel)
            except FileNotFoundError:
                continue
            found[rel] = _entry(info)
    return found


def _entry(info: os.stat_result) -> Entry:
    if stat.S_ISDIR(info.st_mode):
        return ("d", (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid))
    return ("f", info.st_ino)


def _lstat(path: Path) -> Entry | None:
    try:
        return _entry(os.lstat(path))
    except FileNotFoundError:
        return None


def _set_folder(path: Path, attrs: object) -> None:
    mode, uid, gid = attrs  # type: ignore[misc]
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)


@dataclass
class _Pending:
    due: float
    target: Entry | None  # None: the truth removed it


class NfsView:
    """One node's view (``root``) of the export ``truth``; see the module's docstring."""

    def __init__(self, truth: Path, root: Path, index: int, seed: int, bound: float) -> None:
        self.truth, self.root, self.index = truth, root, index
        self.seed, self.bound = seed, bound
        self.seen: dict[str, Entry] = {}  # what view and truth last agreed on
        self.pending: dict[str, _Pending] = {}
        self._versions: dict[str, int] = {}
        self._temp = itertools.count()

    def mirror(self) -> None:
        """The view as the truth is now, at once (a node mounting the share)."""
        self.root.mkdir(parents=True, exist_ok=True)
        _set_folder(self.root, _walk_root(self.truth))
        for rel, entry in sorted(_walk(self.truth).items()):
            self._install(rel, entry)

    def delay(self, rel: str) -> float:
        """The next change of ``rel`` reaches this node this many seconds late."""
        version = self._versions[rel] = self._versions.get(rel, 0) + 1
        return random.Random(f"{self.seed}/{self.index}/{rel}/{version}").uniform(0, self.bound)

    # --- the node's own changes: to the truth at once ----------------------------------------
    def push(self) -> None:
        view = _walk(self.root)
        for rel in sorted(self.seen.keys() - view.keys(), reverse=True):  # children first
            self._push_removal(rel, self.seen.pop(rel))
        for rel, entry in sorted(view.items()):  # parents first
            if self.seen.get(rel) != entry:
                self._push_change(rel, entry)

    def _push_removal(self, rel: str, seen: Entry) -> None:
        self.pending.pop(rel, None)
        target = self.truth / rel
        try:
            if seen[0] == "d":
                os.rmdir(target)
            elif _lstat(target) == seen:
                os.unlink(target)
        except OSError:
            pass  # changed meanwhile, or a folder another node filled: the truth keeps it

    def _push_change(self, rel: str, entry: Entry) -> None:
        source, target = self.root / rel, self.truth / rel
        self._remake_folders(rel)
        try:
            there = _lstat(target)
            if entry[0] == "d":
                if there is None:
                    target.mkdir()
                    _set_folder(target, entry[1])
                elif there[0] == "d" and rel in self.seen:  # a chmod/chown on the node
                    _set_folder(target, entry[1])
                elif there[0] == "d":  # mkdir of a folder the server has: EEXIST, theirs
                    _set_folder(source, there[1])
                    entry = there
            elif there != entry:
                self._link(source, target)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return  # gone or changed meanwhile: the next pass sees what is there
        self.seen[rel] = entry
        self.pending.pop(rel, None)

    def _remake_folders(self, rel: str) -> None:
        """The folders above ``rel`` that the server lost while this node still has them (another
        node or the server removed them): made again on the server, as the node's own mkdir does.
        A create that must be exclusive (mkdir) is never answered from the client's cache: the
        NFS client revalidates the cached entry with the server first (Linux fs/nfs/dir.c,
        nfs4_lookup_revalidate: "We cannot do exclusive creation on a positive dentry"), finds
        it gone and sends MKDIR; every writer of a run folder makes its folder first
        (trainer.common.files, trainer.checkpoints.single_file), so its files land in the folder
        made again."""
        parts = rel.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth])
            if (self.truth / folder).exists() or not (self.root / folder).is_dir():
                continue
            attrs = _entry(os.lstat(self.root / folder))
            (self.truth / folder).mkdir()
            _set_folder(self.truth / folder, attrs[1])
            self.seen[folder] = attrs
            self.pending.pop(folder, None)

    def _link(self, source: Path, target: Path) -> None:
        """``target`` becomes ``source``'s inode in one rename (never absent on the way)."""
        temp = target.parent / f".nfs-view-{self.index}-{next(self._temp)}"
        os.link(source, temp, follow_symlinks=False)
        os.replace(temp, target)

    # --- the other nodes' changes: late -------------------------------------------------------
    def pull(self, now: float) -> None:
        truth = _walk(self.truth)
        for rel, entry in sorted(truth.items()):
            if _lstat(self.root / rel) == entry:
                self.seen[rel] = entry
                self.pending.pop(rel, None)
            else:
                self._due(rel, entry, now)
        for rel in sorted(self.seen.keys() - truth.keys(), reverse=True):
            self._due(rel, None, now)

    def _due(self, rel: str, target: Entry | None, now: float) -> None:
        pending = self.pending.get(rel)
        if pending is None or pending.target != target:
            pending = self.pending[rel] = _Pending(now + self.delay(rel), target)
        if pending.due > now:
            return
        # Only over what the view and the truth agreed on: a change the node made since is its
        # own, which the next push takes to the truth.
        if _lstat(self.root / rel) != self.seen.get(rel):
            return
        if target is None:
            self._remove(rel)
        elif (self.root / rel).parent.is_dir():
            self._install(rel, target)

    def _install(self, rel: str, entry: Entry) -> None:
        path = self.root / rel
        try:
            if entry[0] == "d":
                path.mkdir(exist_ok=True)
                _set_folder(path, entry[1])
            else:
                self._link(self.truth / rel, path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError):
            return
        self.seen[rel] = _lstat(path) or entry
        self.pending.pop(rel, None)

    def _remove(self, rel: str) -> None:
        path = self.root / rel
        try:
            if self.seen[rel][0] == "d":
                os.rmdir(path)  # its entries go first, each when its own delay is over
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            return
        del self.seen[rel]
        self.pending.pop(rel, None)


def _walk_root(root: Path) -> object:
    return _entry(os.lstat(root))[1]


class NfsViews:
    """The views of every node of a pool, kept by one thread that syncs every ``poll`` s."""

    def __init__(self, truth: Path, base: Path, nodes: int, seed: int, bound: float) -> None:
        self.truth = truth
        self.views = [NfsView(truth, base / f"n{i}", i, seed, bound) for i in range(nodes)]
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def path(self, index: int) -> Path:
        return self.views[index].root

    def start(self, poll: float = 0.05) -> None:
        for view in self.views:
            view.mirror()
        self._thread = threading.Thread(target=self._run, args=(poll,), daemon=True)
        self._thread.start()

    def sync(self, now: float) -> None:
        """One pass: every node's own changes to the truth, then what is due to every node."""
        with self._lock:
            for view in self.views:
                view.push()
            for view in self.views:
                view.pull(now)

    def push(self) -> None:
        """What the nodes wrote, to the truth now (before a test reads the export)."""
        with self._lock:
            for view in self.views:
                view.push()

    def _run(self, poll: float) -> None:
        while not self._stop.wait(poll):
            try:
                self.sync(time.monotonic())
            except Exception as err:  # kept for the test's report; syncing goes on
                self.failure = err

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.push()
