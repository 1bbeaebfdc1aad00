"""The Python packages the trainer image pins, read from its build inputs: docker/requirements.txt,
the Dockerfile's torch and the Horovod version scripts/build_horovod.sh builds. A job's code
folder installs its requirements over these on each node and can never replace one
(trainer.launch.code_folder), so the stack refuses a requirement that excludes an image pin
before anything is created (trainer.common.requirements)."""

from __future__ import annotations

import functools
import re

from packaging.utils import canonicalize_name

from infra.image_inputs import DOCKERFILE, REPO
from infra.toolchain import BASE_PYTHON

REQUIREMENTS = "docker/requirements.txt"
HOROVOD_SCRIPT = "scripts/build_horovod.sh"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s#;]+)")


@functools.cache
def image_pins() -> dict[str, str]:
    """Canonical package name -> the version the image installs."""
    pins = {}
    for line in (REPO / REQUIREMENTS).read_text().splitlines():
        if found := _PIN.match(line.strip()):
            pins[canonicalize_name(found.group(1))] = found.group(2)
    dockerfile = (REPO / DOCKERFILE).read_text()
    if torch := re.search(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.M):
        pins["torch"] = torch.group(1)
    horovod = (REPO / HOROVOD_SCRIPT).read_text()
    if found := re.search(r"^HOROVOD_VERSION=(\S+)$", horovod, re.M):
        pins["horovod"] = found.group(1)
    return pins


def image_environment() -> dict[str, str]:
    """The environment markers of the image's Python (python3.13 -> 3.13) that a requirement's
    marker may test: a line for another Python is not installed there."""
    version = BASE_PYTHON.removeprefix("python")
    return {"python_version": version, "python_full_version": f"{version}.0"}
