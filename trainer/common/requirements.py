"""A team's ``requirements.txt`` against the packages the trainer image already holds: which of
its lines the image's versions cannot satisfy. A job's requirements are installed over the image,
never in place of its packages (torch, numpy, and Horovod's build against them), so such a line
can never install; the deployer says so before anything is created (against the image's pins),
and a node before pip runs (against what its image has). Pure: ``packaging``, which pip itself
vendors for the same parsing."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

# pip's requirements-file syntax: a comment starts at `#` at a line's start or after
# whitespace, and a line ending in `\` continues on the next (pip's req_file.py).
_COMMENT = re.compile(r"(^|\s+)#.*$")


@dataclass(frozen=True)
class Conflict:
    """A requirement the image's version of its package does not meet."""

    line: int
    requirement: str
    name: str
    have: str

    def __str__(self) -> str:
        return f"line {self.line} `{self.requirement}` excludes the image's {self.name} {self.have}"


def requirement_lines(text: str) -> Iterator[tuple[int, Requirement]]:
    """Each line of a requirements file that names a package by name (``numpy<2``,
    ``pkg[extra]>=1; python_version>"3.8"``, ``pkg @ https://...``), with its number. Options
    (``-r``, ``-c``, ``--index-url``), editables and plain paths or URLs name no version to
    compare here and are skipped; pip resolves them against the image's constraints."""
    number, pending = 0, ""
    for number_here, raw in enumerate(text.splitlines(), start=1):
        number = number if pending else number_here
        line = _COMMENT.sub("", raw)
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        line, pending = (pending + line).strip(), ""
        if not line or line.startswith(("-", ".", "/")) or "://" in line.split("@")[0]:
            continue
        try:
            yield number, Requirement(line)
        except InvalidRequirement:
            continue  # pip says what is wrong with it, in its own words


def conflicts(
    text: str, have: Mapping[str, str], environment: Mapping[str, str] | None = None
) -> list[Conflict]:
    """The lines of ``text`` that ``have`` (a canonical package name -> its version) cannot
    satisfy: a version outside the line's specifiers, or a direct URL for a package the image
    holds. A line whose environment marker does not hold in ``environment`` (the image's
    Python, where the deployer checks) is not installed there and cannot conflict."""
    found = []
    for number, requirement in requirement_lines(text):
        marker: Marker | None = requirement.marker
        if marker is not None and not marker.evaluate(dict(environment or {})):
            continue
        name = canonicalize_name(requirement.name)
        version = have.get(name)
        if version is None:
            continue
        if requirement.url or not requirement.specifier.contains(version, prereleases=True):
            found.append(Conflict(number, str(requirement), name, version))
    return found
