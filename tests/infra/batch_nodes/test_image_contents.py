"""What a job's processes see in an emulated container: what the trainer image holds
(docker/Dockerfile: the trainer package on its PYTHONPATH, its virtual environment), never the
checkout the tests run from, so a job that works here only because of the checkout fails here
as on a node."""

from __future__ import annotations

import pytest

from tests.batch_emulator import REPO
from tests.batch_emulator.jobs import (
    RUN_SECONDS,
    booted,
    describe,
    folder_logs,
    make_spec,
    run_folder,
    submit,
)

# Real processes on emulated nodes: make test runs these one at a time.
pytestmark = pytest.mark.processes

# Which top-level packages a worker can import, and its working folder.
PROBE = (
    "import importlib.util as u, os, sys; "
    "found = [n for n in ('trainer', 'horovod', 'examples', 'infra', 'dt_commands', 'tests') "
    "if u.find_spec(n)]; "
    "print('IMPORTABLE', *found, 'CWD', os.getcwd(), 'PATH', *sys.path, flush=True)"
)


def test_a_workers_container_holds_the_image_and_not_the_checkout(make_cluster, storage, cpu_stack):
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill")
    command = ("python", "-c", PROBE)
    spec = make_spec(cpu_stack, storage, trainer={}, command=command, engine="torch")
    run = submit(cluster, spec)
    assert run.wait(RUN_SECONDS), describe(cluster, run)
    assert (run.state, run.exit_code) == ("completed", 0), describe(cluster, run)
    said = [
        line.split("IMPORTABLE ", 1)[1]
        for line in folder_logs(run_folder(cluster, spec)).splitlines()
        if "IMPORTABLE " in line
    ]
    assert len(said) == 2, describe(cluster, run)  # one worker per node
    for line in said:
        found, rest = line.split(" CWD ", 1)
        cwd, path = rest.split(" PATH ", 1)
        assert found.split() == ["trainer", "horovod"], line
        assert not cwd.startswith(str(REPO)), line
        assert str(REPO) not in path.split(), line
