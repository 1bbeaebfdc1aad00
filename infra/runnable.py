"""Whether what a job runs is on its nodes: the image holds the trainer package alone of this
repository (docker/Dockerfile: ``COPY trainer /opt/trainer/trainer``), so a script, or a
module or plug-in of another of its packages (``examples``...), must come in the job's ``code``
folder (infra.code_snapshot), where the command runs. Checked when the settings load: such a
job would fail on every node after the pool started, with Python's "No such file" or
``ModuleNotFoundError``, while a laptop, with the checkout on its path, runs it. A module of
another package (torch's, or one the code folder's requirements install) is taken as there."""

from __future__ import annotations

from collections.abc import Sequence

IMAGE_PACKAGES = ("trainer",)  # the repository's packages the image puts on PYTHONPATH
_PYTHONS = ("python", "python3", "python3.11")
_SHELLS = ("bash", "sh")
# A shell's options that take the next word as their value (bash(1)).
_SHELL_VALUE_OPTIONS = ("-o", "+o", "-O", "+O", "--rcfile", "--init-file")
# Python's options that take a value as the next word (python(1)).
_PYTHON_VALUE_OPTIONS = ("-W", "-X", "-Q")


def what_runs(command: Sequence[str]) -> tuple[str, str] | None:
    """("script", path) or ("module", name) that ``command`` starts; None when it starts
    neither (inline code with -c, a program of the image's own)."""
    program = command[0].rsplit("/", 1)[-1]
    words = list(command[1:])
    if program in _SHELLS:
        while words and words[0][:1] in ("-", "+"):
            option = words.pop(0)
            short = option.startswith("-") and not option.startswith("--")
            if short and "c" in option[1:]:  # -c, -ec, ...: inline commands, no script
                return None
            if option in _SHELL_VALUE_OPTIONS and words:
                words.pop(0)
        return ("script", words[0]) if words else None
    if program not in _PYTHONS:
        return None
    while words and words[0].startswith("-"):
        option = words.pop(0)
        if option == "-m" and words:
            return "module", words[0]
        if option == "-c":
            return None
        if option in _PYTHON_VALUE_OPTIONS and words:
            words.pop(0)
    return ("script", words[0]) if words else None


def module_files(module: str) -> tuple[str, str]:
    """The two files that can hold ``module`` (``pkg/mod.py`` or ``pkg/mod/__init__.py``)."""
    path = module.replace(".", "/")
    return f"{path}.py", f"{path}/__init__.py"


def missing(
    kind: str, name: str, code_files: frozenset[str] | None, repo_packages: frozenset[str]
) -> bool:
    """Whether a script or module ``name`` is on neither the image nor in the code folder
    (``code_files``: the folder's files, relative to it; None: the job has none).
    ``repo_packages``: the repository's top-level packages, of which only ``IMAGE_PACKAGES``
    reach the image."""
    if kind == "module":
        top = name.split(".", 1)[0]
        if top in IMAGE_PACKAGES or top not in repo_packages:
            return False
        return code_files is None or not any(f in code_files for f in module_files(name))
    if name.startswith("/") or "$" in name:
        return False  # a path on the node (the image's, or one of Batch's variables)
    return code_files is None or name.removeprefix("./") not in code_files
