"""A job's code folder (``jobs.<name>.code``) as one content-addressed snapshot: the folder's
files that git tracks, in a gzipped tar whose bytes depend on their paths, contents and
executable bits only (no mtimes, owners or order of the file system), and its SHA-256, which
names the blob and is one of the job's inputs. A link git tracks stays a link (its text is
what git holds, the same in every checkout); it must stay inside the folder, here and where a
node unpacks it, and point at something the snapshot holds. Pure: git and the standard
library."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

# Compressed. A code folder is source and small files; beyond this it holds data or weights,
# which belong in the datasets container (dt-data upload) or the image, not in a snapshot that
# is built in memory where `pulumi up` runs and downloaded by every node before each job.
MAX_BYTES = 100 * 1024 * 1024
REQUIREMENTS = "requirements.txt"  # at the folder's top: installed on the image on each node


class SnapshotError(ValueError):
    """The folder cannot be a snapshot; the message names the fix (no setting name)."""


@dataclass(frozen=True)
class CodeSnapshot:
    folder: str  # as the stack gives it, relative to the repository
    sha256: str
    files: int
    data: bytes = field(repr=False, compare=False)

    @property
    def blob_name(self) -> str:
        """Its name in the ``code`` container: the hash, so equal code is one blob."""
        return f"{self.sha256}.tar.gz"

    @property
    def requirements(self) -> str | None:
        """Its ``requirements.txt`` (what each node installs over the image), if it has one."""
        with tarfile.open(fileobj=io.BytesIO(self.data), mode="r:gz") as tar:
            try:
                member = tar.extractfile(REQUIREMENTS)
            except KeyError:
                return None
            return member.read().decode("utf-8", "replace") if member is not None else None

    @property
    def file_names(self) -> frozenset[str]:
        """The snapshot's files, relative to its folder."""
        with tarfile.open(fileobj=io.BytesIO(self.data), mode="r:gz") as tar:
            return frozenset(tar.getnames())


def tracked_files(folder: Path, repo: Path) -> list[str]:
    """The files under ``folder`` that git tracks in ``repo``, relative to ``folder``, sorted."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", "--", str(folder.relative_to(repo))],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise SnapshotError(f"cannot list its tracked files with git ({err})") from None
    base = folder.relative_to(repo)
    names = [Path(name.decode()).relative_to(base) for name in listed.split(b"\0") if name]
    return sorted(name.as_posix() for name in names)


def snapshot(folder_text: str, repo: Path, limit: int = MAX_BYTES) -> CodeSnapshot:
    """The snapshot of ``folder_text`` (relative to ``repo``); raises SnapshotError."""
    if not folder_text.strip():
        # What an unset variable gives (code: "$CODE"): `repo / ""` would be the whole
        # repository. `.` says that on purpose (a plug-in of a top-level package needs it).
        raise SnapshotError(
            "empty, which would be the whole repository; give the folder that holds the "
            "job's code (examples/torchrun_ddp), `.` if you mean the whole repository, or "
            "remove the setting"
        )
    folder = (repo / folder_text).resolve()
    if not folder.is_relative_to(repo.resolve()):
        raise SnapshotError("outside the repository; give a folder inside it (its tracked files)")
    if not folder.is_dir():
        raise SnapshotError("no such folder; give a folder of the repository")
    names = tracked_files(folder, repo.resolve())
    if not names:
        raise SnapshotError("git tracks no file there; git add the script, then commit")
    for name in names:
        if (folder / name).is_symlink():
            _check_link(folder, name, names)
    data = _tar_gz(folder, names)
    if len(data) > limit:
        raise SnapshotError(
            f"{len(data) / 2**20:.1f} MB compressed, over the {limit / 2**20:g} MB a code "
            "snapshot may take; move data and weights to the datasets container (dt-data upload)"
        )
    return CodeSnapshot(folder_text, hashlib.sha256(data).hexdigest(), len(names), data)


def _check_link(folder: Path, name: str, names: list[str]) -> None:
    """Refuses the link ``name`` unless it resolves inside ``folder`` both lexically (as the
    node's unpacking, tarfile's "data" filter, reads it in another folder) and on this file
    system (through other links), and unless the snapshot holds what it points at."""
    target = os.readlink(folder / name)
    lexical = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    real = Path(os.path.realpath(folder / name))
    if lexical == ".." or lexical.startswith("../") or not real.is_relative_to(folder):
        raise SnapshotError(
            f"its link {name} points at {target}, outside the folder, which the node does not "
            "have; replace it by the file it points at, or move that into the folder"
        )
    if posixpath.isabs(target):
        raise SnapshotError(
            f"its link {name} points at {target}, an absolute path, which names another place "
            "in every checkout and on the node; make it relative (ln -sfr), or replace it by "
            "the file it points at"
        )
    inside = real.relative_to(folder).as_posix()
    if inside != "." and not any(n == inside or n.startswith(f"{inside}/") for n in names):
        raise SnapshotError(
            f"its link {name} points at {target}, which the snapshot does not hold (git "
            "tracks no file there); git add it, or remove the link"
        )


def _tar_gz(folder: Path, names: list[str]) -> bytes:
    """A gzipped tar of ``names``: fixed mtime, owner and modes (0644, or 0755 when the owner
    may execute), sorted, and no name or time in the gzip header."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            path = folder / name
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_symlink():
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
                tar.addfile(info)
                continue
            try:
                content = path.read_bytes()
            except OSError as err:
                raise SnapshotError(
                    f"cannot read {name} ({err.strerror}); restore it or git rm it"
                ) from None
            info.size, info.mode = len(content), 0o755 if path.stat().st_mode & 0o100 else 0o644
            tar.addfile(info, io.BytesIO(content))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()
