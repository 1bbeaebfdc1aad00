"""A job's code folder (``jobs.<name>.code``) as one content-addressed snapshot: the folder's
files that git tracks, in a gzipped tar whose bytes depend on their paths, contents and
executable bits only (no mtimes, owners or order of the file system), and its SHA-256, which
names the blob and is one of the job's inputs. Pure: git and the standard library."""

from __future__ import annotations

import gzip
import hashlib
import io
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
    def has_requirements(self) -> bool:
        return REQUIREMENTS in self.file_names

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
    folder = (repo / folder_text).resolve()
    if not folder.is_relative_to(repo.resolve()):
        raise SnapshotError("outside the repository; give a folder inside it (its tracked files)")
    if not folder.is_dir():
        raise SnapshotError("no such folder; give a folder of the repository")
    names = tracked_files(folder, repo.resolve())
    if not names:
        raise SnapshotError("git tracks no file there; git add the script, then commit")
    data = _tar_gz(folder, names)
    if len(data) > limit:
        raise SnapshotError(
            f"{len(data) / 2**20:.1f} MB compressed, over the {limit / 2**20:g} MB a code "
            "snapshot may take; move data and weights to the datasets container (dt-data upload)"
        )
    return CodeSnapshot(folder_text, hashlib.sha256(data).hexdigest(), len(names), data)


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
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, str(path.readlink()), 0o777
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
