"""A tiny pure-Python wheel written by hand: a requirement that pip installs with no index and
no build step, as a team's code may carry its own wheels beside its requirements.txt."""

from __future__ import annotations

import zipfile
from pathlib import Path


def write_wheel(folder: Path, name: str, source: str, requires: tuple[str, ...] = ()) -> Path:
    """``folder/<name>-0.1-py3-none-any.whl`` holding the module ``name`` (``source``) and
    depending on ``requires`` (``numpy>=1``)."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-0.1.dist-info"
    depends = "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    files = {
        f"{name}/__init__.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n{depends}",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    # PEP 376/427: RECORD lists every file; its own line carries no hash.
    record = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    wheel = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(path, text)
    return wheel
