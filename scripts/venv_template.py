"""The set-up's installed environment kept in the cache, so a fresh clone gets it in a second or
two instead of a minute of pip and byte-compiling (scripts/setup_env.sh calls this).

A template is a finished .venv stored under CACHE_DIR/venv/KEY, where KEY hashes everything that
decides what pip installs; a clone's .venv is made of hard links to it (a copy across file
systems), with the scripts that name the template's origin rewritten as new files, so the
template is never changed through a clone by pip or Python, which replace files; an editor that
writes a file of .venv in place changes the template's (as with uv's default hard links):
remove CACHE_DIR/venv to start afresh. Standard library only: it runs before .venv exists.

    venv_template.py key PYTHON FILE...          print the key
    venv_template.py restore CACHE_DIR KEY VENV  exit 0 when VENV was made, 3 when no template
    venv_template.py save CACHE_DIR KEY VENV     store VENV as the template (the only one kept)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

# What pip resolves from a remote index (the dependencies' own unpinned dependencies) is not in
# the key: a template is rebuilt after this long, so a clone's environment is at most a week
# older than a fresh install would be.
MAX_AGE_SECONDS = 7 * 24 * 3600
# Marks a finished template: a save interrupted half-way leaves none.
COMPLETE = ".template-complete"
# The absolute path of the .venv a template was saved from: what its scripts name.
ORIGIN = ".template-origin"
NO_TEMPLATE = 3


def _pip_configuration(python: str) -> list[str]:
    """pip's configuration as `pip config list` prints it, and what the files and folders it
    names hold (a constraints file, a local index or wheel folder): they decide what is
    installed as much as pyproject.toml does."""
    listing = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    parts = [listing]
    for line in sorted(listing.splitlines()):
        value = line.partition("=")[2].strip().strip("'\"")
        for word in value.split():
            path = Path(unquote(urlparse(word).path) if word.startswith("file:") else word)
            if path.is_file():
                parts.append(f"{path}:{hashlib.sha256(path.read_bytes()).hexdigest()}")
            elif path.is_dir():
                parts += [f"{f}:{f.stat().st_size}" for f in sorted(path.rglob("*")) if f.is_file()]
    return parts


def key(python: str, files: list[str]) -> str:
    """A hash of the interpreter, the set-up's input files and pip's configuration."""
    digest = hashlib.sha256()
    interpreter = subprocess.run(
        [python, "-c", "import sys; print(sys.version, sys.base_prefix, sys.platform)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    digest.update(interpreter.encode())
    for name in files:
        digest.update(name.encode() + b"\0" + Path(name).read_bytes() + b"\0")
    for part in _pip_configuration(python):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system (or no hard links there): a copy
        shutil.copy2(source, target)


def _rewrite(staged: Path, origin: str, venv: Path) -> None:
    """Replace the origin's path by ``venv``'s in the scripts under bin/ and in pyvenv.cfg, each
    as a new file (the old one is a hard link into the template)."""
    candidates = [p for p in (staged / "bin").iterdir() if p.is_file() and not p.is_symlink()]
    for path in [*candidates, staged / "pyvenv.cfg"]:
        data = path.read_bytes()
        if origin.encode() not in data or b"\0" in data[:1024]:  # not a script
            continue
        new = path.with_name(path.name + ".rewrite")
        new.write_bytes(data.replace(origin.encode(), str(venv).encode()))
        shutil.copymode(path, new)
        new.replace(path)


def _usable(template: Path) -> bool:
    """Finished, and younger than MAX_AGE_SECONDS."""
    complete = template / COMPLETE
    return complete.exists() and time.time() - complete.stat().st_mtime <= MAX_AGE_SECONDS


def restore(cache_dir: Path, name: str, venv: Path) -> bool:
    """Make ``venv`` from the template ``name``, if it is usable."""
    template = cache_dir / "venv" / name
    if not _usable(template):
        return False
    venv = venv.absolute()
    staged = venv.with_name(venv.name + ".restoring")
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(template, staged, symlinks=True, copy_function=_link_or_copy)
    origin = (staged / ORIGIN).read_text()
    for marker in (COMPLETE, ORIGIN):
        (staged / marker).unlink()
    _rewrite(staged, origin, venv)
    staged.rename(venv)
    return True


def save(cache_dir: Path, name: str, venv: Path) -> None:
    """Store ``venv`` as the template ``name`` and remove any other (each is gigabytes)."""
    root = cache_dir / "venv"
    template = root / name
    if _usable(template):
        return
    root.mkdir(parents=True, exist_ok=True)
    staged = root / f"{name}.saving-{os.getpid()}"
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(venv, staged, symlinks=True, copy_function=_link_or_copy)
    (staged / ORIGIN).write_text(str(venv.absolute()))
    (staged / COMPLETE).touch()
    shutil.rmtree(template, ignore_errors=True)  # an unfinished or expired one
    try:
        staged.rename(template)
    except OSError:  # another set-up saved it first
        shutil.rmtree(staged, ignore_errors=True)
    for other in root.iterdir():
        if other.name != name and not other.name.startswith(f"{name}.saving-"):
            shutil.rmtree(other, ignore_errors=True)


def main(argv: list[str]) -> int:
    command, *args = argv
    try:
        return _run(command, args)
    except (OSError, subprocess.CalledProcessError) as err:
        print(f"error: the cached environment ({command}): {err}", file=sys.stderr)
        return 1


def _run(command: str, args: list[str]) -> int:
    if command == "key":
        print(key(args[0], args[1:]))
    elif command == "restore":
        return 0 if restore(Path(args[0]), args[1], Path(args[2])) else NO_TEMPLATE
    elif command == "save":
        save(Path(args[0]), args[1], Path(args[2]))
    else:
        print(f"error: unknown command {command!r}: key, restore or save", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
