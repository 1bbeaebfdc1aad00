"""The plans the operator's commands are checked against (tests/support/stacks.py)."""

from tests.support.stacks import acceptance_plan, dev_plan  # noqa: F401  # fixtures
