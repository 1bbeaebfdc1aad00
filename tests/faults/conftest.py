"""Every run started by the fault tests is checked for processes left alive
(tests/process_tree.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(no_leftover_processes: str) -> None:
    """Every run started here is checked for processes left alive (tests/process_tree.py)."""


@pytest.fixture
def repo() -> Path:
    return Path(__file__).resolve().parents[2]
