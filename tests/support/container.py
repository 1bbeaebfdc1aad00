"""What a container started from the trainer image runs for a Batch task's command line.

Batch passes a task's command line as the container's CMD and keeps the image's ENTRYPOINT
(MicrosoftDocs/azure-docs #94943), like ``docker create IMAGE COMMAND...``: the process is
ENTRYPOINT + (COMMAND or the image's CMD). This module reads the final stage's ENTRYPOINT, CMD
and SHELL from the Dockerfile (JSON or shell form) and builds that argv, so tests execute the
command lines the way a node does.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of the last stage, continuation lines joined, comments dropped."""
    stage: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        if not whole:
            continue
        keyword, _, args = whole.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage = []
        stage.append((keyword, args.strip()))
    return stage


def _form(args: str, shell: list[str]) -> list[str]:
    """Exec form (a JSON array of strings) as is; shell form runs under the SHELL."""
    if args.startswith("["):
        try:
            value = json.loads(args)
        except ValueError:
            value = None
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return value
    return [*shell, args]


def image_command(dockerfile: Path = DOCKERFILE) -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) of the image the Dockerfile's final stage builds."""
    shell = ["/bin/sh", "-c"]
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    cmd_in_stage = False
    for keyword, args in _instructions(dockerfile.read_text()):
        if keyword == "SHELL":
            shell = json.loads(args)
        elif keyword == "ENTRYPOINT":
            entrypoint = _form(args, shell)
            if not cmd_in_stage:
                cmd = []  # setting ENTRYPOINT resets a CMD inherited from the base image
        elif keyword == "CMD":
            cmd = _form(args, shell)
            cmd_in_stage = True
    if entrypoint is None:
        raise AssertionError(
            f"{dockerfile}: the final stage sets no ENTRYPOINT, so the base image's (unknown "
            "here) stays and receives every task command line: set ENTRYPOINT []"
        )
    return entrypoint, cmd or []


def container_argv(command_line: str, dockerfile: Path = DOCKERFILE) -> list[str]:
    """The argv of the container Batch starts for ``command_line`` (split like a shell would)."""
    entrypoint, cmd = image_command(dockerfile)
    command = shlex.split(command_line)
    return [*entrypoint, *(command or cmd)]


def run_in_container(
    command_line: str,
    env: dict[str, str],
    cwd: Path,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Execute the container's argv here, with only ``env`` (no inherited variables)."""
    argv = container_argv(command_line)
    return subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def stub_program(path: Path, record: Path) -> Path:
    """An executable that appends its argv (after the program name) as JSON to ``record``."""
    import sys

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    path.chmod(0o755)
    return path


def recorded(record: Path) -> list[list[str]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def base_path() -> str:
    """System folders for PATH behind a stub folder (bash, coreutils)."""
    return os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if Path(p).is_dir())


def one_node_pool(
    tmp_path: Path, worker_stub: str, job_id: str, batch_port: int, rendezvous_port: int
) -> tuple[dict[str, str], Path, Path]:
    """A one-node pool's task environment for running the job's command lines here: ``python``
    on PATH is ``worker_stub`` (a bash script with ``%s`` for the real interpreter, which it
    runs for everything but workers); returns the environment, the working folder and the file
    the stub records worker command lines in."""
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(worker_stub % sys.executable)
    python.chmod(0o755)
    ran, workdir = tmp_path / "workers-ran.txt", tmp_path / "wd"
    workdir.mkdir()
    # The image runs the trainer from PYTHONPATH (docker/Dockerfile: /opt/trainer holds
    # trainer/ alone); here a folder holding only this checkout's trainer/, never the checkout.
    # (This interpreter's editable install still maps infra/ and dt_commands/; the node
    # emulator, tests/batch_emulator, hides them.)
    image = tmp_path / "image"
    image.mkdir()
    (image / "trainer").symlink_to(REPO / "trainer")
    env = {
        "PATH": f"{python.parent}:{base_path()}",
        "PYTHONPATH": str(image),
        "HOME": str(tmp_path),
        "AZ_BATCH_NODE_MOUNTS_DIR": str(tmp_path / "fsmounts"),
        "AZ_BATCH_TASK_WORKING_DIR": str(workdir),
        "AZ_BATCH_HOST_LIST": "127.0.0.1",
        "AZ_BATCH_MASTER_NODE": f"127.0.0.1:{batch_port}",
        "AZ_BATCH_IS_CURRENT_NODE_MASTER": "true",
        "AZ_BATCH_JOB_ID": job_id,
        "MASTER_PORT": str(rendezvous_port),
        "WORKERS_RAN": str(ran),
    }
    return env, workdir, ran
