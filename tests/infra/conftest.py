"""Evaluate the Pulumi program under mocks once per stack file and share the result."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import load_schema
from infra.mocks import DeclaredResource
from infra.plan import Plan, evaluate, read_stack_file

REPO = Path(__file__).resolve().parents[2]
STACKS = ("dev", "vision-prod")


def stack_values(stack: str) -> dict:
    return read_stack_file(REPO / f"Pulumi.{stack}.yaml")


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
def prod_plan() -> Plan:
    return evaluate("vision-prod", stack_values("vision-prod"))


def of_type(plan: Plan, typ: str) -> list[DeclaredResource]:
    return [r for r in plan.resources if r.typ == typ]


def one(plan: Plan, typ: str, name_suffix: str = "") -> DeclaredResource:
    """Exactly one resource of ``typ`` (whose name ends with ``name_suffix``), or fail."""
    found = [r for r in of_type(plan, typ) if r.name.endswith(name_suffix)]
    assert len(found) == 1, f"expected one {typ} *{name_suffix}, found {[r.name for r in found]}"
    return found[0]
