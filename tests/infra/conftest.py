"""The plans of the stack files, evaluated under mocks once per session
(tests/support/stacks.py)."""

from tests.support.stacks import (  # noqa: F401  # fixtures
    acceptance_plan,
    dev_plan,
    plan,
    prod_plan,
    schema,
)
