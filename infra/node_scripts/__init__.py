"""The bash that runs on the pool's nodes and on the NFS server, kept as script files in this
folder (``*.sh``: read, diffed and checked by shellcheck on their own, tests/ci/test_shellcheck.py),
how the program fills them, and the one way a script is handed to bash as a command line.

A script file opens with a header for its readers (comment lines, shellcheck's directives among
them, up to the first blank line; after the shebang when the script has one), which is not
sent. In the rest ``__NAME__`` stands for a value the program fills in: a word bash and
shellcheck read as a name, inside ``$(( ))`` too. A line that holds only ``__NAME__`` takes a
whole filled script, or nothing. Every placeholder needs a value and every value a placeholder.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
# A whole line (taking a script, newline and all) or a word within a line (taking one value).
_PLACEHOLDER = re.compile(
    r"^__(?P<line>[A-Z0-9]+(?:_[A-Z0-9]+)*)__\n|__(?P<word>[A-Z0-9]+(?:_[A-Z0-9]+)*)__", re.M
)


def render(name: str, **values: object) -> str:
    """The script file ``name`` of this folder as it is sent: its header left out, each
    placeholder filled from ``values`` (a script for a whole-line one: "" or text ending in a
    newline; one line of text, or a number, for one within a line)."""
    body = _body(name, (FOLDER / name).read_text(encoding="utf-8"))
    used: set[str] = set()

    def fill(match: re.Match[str]) -> str:
        key = match["line"] or match["word"]
        if key not in values:
            raise KeyError(f"{name}: no value for __{key}__")
        used.add(key)
        value = str(values[key])
        if match["line"] and value and not value.endswith("\n"):
            raise ValueError(f"{name}: __{key}__ takes a script ending in a newline: {value!r}")
        if match["word"] and "\n" in value:
            raise ValueError(f"{name}: __{key}__ takes one line; put a script on its own line")
        return value

    filled = _PLACEHOLDER.sub(fill, body)
    if unused := sorted(set(values) - used):
        raise KeyError(f"{name}: no placeholder for {', '.join(unused)}")
    return filled


def _body(name: str, text: str) -> str:
    """``text`` less its header (kept: the shebang before it)."""
    shebang = ""
    if text.startswith("#!"):
        shebang, _, text = text.partition("\n")
        shebang += "\n"
    header, blank, body = text.partition("\n\n")
    if not blank or not all(line.startswith("#") for line in header.splitlines()):
        raise ValueError(f"{FOLDER / name}: opens with no header (comment lines, a blank line)")
    return shebang + body


def in_bash(*steps: str, exec_last: bool = False) -> str:
    """A command line that runs ``steps`` in bash one after another, each only if the one before
    succeeded. Batch runs a command line without a shell, and the CustomScript extension with
    ``/bin/sh -c`` or ``/bin/bash -c`` (Azure/custom-script-extension-linux, ``main/exec.go``):
    bash gets the script as one word, quoted so any quote inside survives, which reads the same
    under both. ``exec_last``: the last step replaces bash (``exec``), so that program is the
    process its caller started and receives its signals itself."""
    *first, last = steps
    script = " && ".join([*first, f"exec {last}" if exec_last else last])
    return f"/bin/bash -c {shlex.quote(script)}"
