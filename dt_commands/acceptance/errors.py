"""The acceptance check's three kinds of fault, each one line: bad input (exit 2) and a missing
prerequisite (exit 1), both before anything is created; a failed check (the run cleans up)."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: one line, exit 2, nothing created."""


class Unavailable(RuntimeError):
    """A prerequisite is missing on this machine: one line, exit 1, nothing created."""


class CheckFailed(RuntimeError):
    """A check did not hold; one line naming what was expected and what was seen."""
