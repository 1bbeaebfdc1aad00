"""A pytest plugin (loaded by tests/conftest.py): in CI, a seam test skipped for want of root
fails the run.

The seam tests (the Batch emulator's nodes, the pool's start task, the file-system faults) need
root for namespaces, mounts and other users, and skip without it, saying "needs root". A CI
runner that ran them as a plain user would pass while testing none of them; GitHub Actions
sets ``CI=true``.
"""

from __future__ import annotations

import os

import pytest

SEAM_SKIP = "needs root"
_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under xdist the controller gets every worker's reports through this hook too.
    if report.skipped and SEAM_SKIP in str(report.longrepr):
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") != "true" or not _skipped or hasattr(session.config, "workerinput"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"CI=true and {len(_skipped)} seam test(s) skipped for want of root "
            f"(first: {_skipped[0]}): run the tests as root (sudo make test)",
            red=True,
        )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
