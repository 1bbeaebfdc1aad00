"""The stack files' settings, and the Pulumi program evaluated under mocks once per stack file
and shared: fixtures here, registered for their folders by tests/infra/conftest.py and
tests/dt_commands/conftest.py; ``one`` and ``of_type`` look resources up in a plan."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dt_commands.mocks import DeclaredResource
from dt_commands.plan import Plan, evaluate, read_stack_file
from infra.settings.values import load_schema

REPO = Path(__file__).resolve().parents[2]
STACKS = ("dev", "vision-prod")
# A public address outside the documentation ranges: storage IP rules refuse non-global ones.
CLIENT_IP = "20.30.40.50"


def dt_plan_of_jobs(folder: Path, jobs_yaml: str) -> subprocess.CompletedProcess[str]:
    """`dt-plan` (``python -m dt_commands.plan``) run as a user runs it, on a stack file of
    ``folder`` whose ``jobs`` map is ``jobs_yaml`` (its entries, indented under ``mine:``)."""
    stack_file = folder / "Pulumi.mine.yaml"
    stack_file.write_text(
        "config:\n  gpu-cluster:team: vision\n  gpu-cluster:jobs:\n    mine:\n" + jobs_yaml
    )
    return subprocess.run(
        [sys.executable, "-m", "dt_commands.plan", "--stack", "mine", "--stack-file", stack_file],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def stack_values(stack: str) -> dict:
    return read_stack_file(REPO / f"Pulumi.{stack}.yaml")


def acceptance_options(profile: str, **changes):
    """The options of a real acceptance run, with what it would look up given here."""
    from dt_commands.acceptance.options import Options
    from dt_commands.acceptance.profiles import PROFILES

    values = {
        "profile": PROFILES[profile],
        "stack_name": f"acceptance-{profile}-20261101-120000",
        "location": "eastus",
        "vm_size": PROFILES[profile].vm_size,
        "budget_email": "qa@example.com",
        "image_builder": "acr",
        "image_source_repo": "https://github.com/example-org/distributed-training.git",
        "ssh_public_key": stack_values("dev")["gpu-cluster:sshPublicKey"],
        "client_ip": CLIENT_IP,
    }
    return Options(**{**values, **changes})


def acceptance_values(profile: str) -> dict:
    from dt_commands.acceptance.options import stack_values as acceptance_stack_values

    return acceptance_stack_values(acceptance_options(profile))


@pytest.fixture(scope="session")
def schema() -> dict:
    return load_schema()


@pytest.fixture(scope="session", params=STACKS)
def plan(request) -> Plan:
    return evaluate(request.param, stack_values(request.param))


@pytest.fixture(scope="session")
def dev_plan() -> Plan:
    return evaluate("dev", stack_values("dev"))


@pytest.fixture(scope="session")
def acceptance_plan() -> Plan:
    """The CPU acceptance profile's stack, as `python -m dt_commands.acceptance --profile cpu`
    sets it."""
    return evaluate(acceptance_options("cpu").stack_name, acceptance_values("cpu"))


@pytest.fixture(scope="session")
def prod_plan() -> Plan:
    return evaluate("vision-prod", stack_values("vision-prod"))


def of_type(plan: Plan, typ: str) -> list[DeclaredResource]:
    return [r for r in plan.resources if r.typ == typ]


def one(plan: Plan, typ: str, name_suffix: str = "") -> DeclaredResource:
    """Exactly one resource of ``typ`` (whose name ends with ``name_suffix``), or fail."""
    found = [r for r in of_type(plan, typ) if r.name.endswith(name_suffix)]
    assert len(found) == 1, f"expected one {typ} *{name_suffix}, found {[r.name for r in found]}"
    return found[0]
