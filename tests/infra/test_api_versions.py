"""The Azure API version each Batch resource is sent at, against the versions Azure announced
for retirement (infra.api_versions): the plan names every one that is, and the data plane the
jobs are submitted through is on a supported version."""

from __future__ import annotations

import subprocess
import sys

from infra.api_versions import ANNOUNCED, Retirement, batch_data_plane, retiring, sent_at
from tests.support.stacks import REPO

BATCH = next(r for r in ANNOUNCED if r.module == "batch")


def test_each_batch_resource_of_the_plan_names_the_version_it_is_sent_at(plan):
    batch_types = sorted({r.typ for r in plan.resources if r.typ.startswith("azure-native:batch:")})
    assert batch_types == ["azure-native:batch:BatchAccount", "azure-native:batch:Pool"]
    # pulumi-azure-native 3.29 sends both at 2024-07-01 (its SDK's docstrings say so); an
    # upgrade that changes it changes this line, and the plan's warning with it.
    assert {t: sent_at(t) for t in batch_types} == dict.fromkeys(batch_types, "2024-07-01")
    assert all(BATCH.covers(sent_at(t) or "") for t in batch_types)
    lines = retiring(set(batch_types))
    assert [line.split(" ")[0] for line in lines] == batch_types
    assert all("Azure/Batch #140" in line and "pulumi package add azure-native batch" in line
               for line in lines)  # fmt: skip


def test_the_batch_data_plane_is_on_a_version_not_announced_for_retirement():
    assert not BATCH.covers(batch_data_plane()), batch_data_plane()


def test_a_retirement_covers_only_versions_before_its_date():
    retirement = Retirement("batch", "2025-06-01", "a notice", "")
    assert retirement.covers("2024-07-01") and retirement.covers("2025-05-01-preview")
    assert not retirement.covers("2025-06-01") and not retirement.covers("2026-08-01")
    assert sent_at("azure-native:batch:NoSuchType") is None
    assert sent_at("pulumi-python:dynamic:Resource") is None


def test_dt_plan_names_the_batch_resources_sent_at_a_retiring_version():
    done = subprocess.run(
        [sys.executable, "-m", "dt_commands.plan", "--stack", "dev"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = lines.index("Azure API versions announced for retirement:")
    assert lines[at + 1].startswith(
        "  azure-native:batch:BatchAccount is sent at API 2024-07-01, before 2025-06-01, which "
        "Azure announced for retirement (Azure/Batch #140, comment of 2026-05-15"
    )
    assert lines[at + 2].startswith("  azure-native:batch:Pool is sent at API 2024-07-01")
