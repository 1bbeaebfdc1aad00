"""Where a node stages datasets and keeps code, per VM size: on the local NVMe array on the sizes
that have one (the pool's start task assembles it, the job's containers bind it), on the
preparation task's folder of the temporary disk elsewhere. The pool and the job are the ones
the program declares under Pulumi mocks; the job's payloads are built from its declared inputs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dt_commands.plan import Plan, disk_lines
from infra.batch import NVME_ROOT, job_options, task_options, trainer_command
from infra.job_spec import JobSpec
from infra.sizes import SUPPORTED
from tests.support.stacks import evaluate, one, stack_values

NVME_BIND = f"-v {NVME_ROOT}:{NVME_ROOT}"
WITH_NVME = ("Standard_ND96isr_H100_v5", "Standard_ND96isr_H200_v5")
WITHOUT_NVME = ("Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4")


def _values(vm_size: str) -> dict:
    values = {**stack_values("dev"), "gpu-cluster:vmSize": vm_size}
    if vm_size == "Standard_ND96isr_H200_v5":
        values["gpu-cluster:location"] = "eastus2"
    return values


@pytest.fixture(scope="module")
def plan_of_size(request) -> Callable[[str], Plan]:
    """The dev stack on a VM size, evaluated under mocks at most once per size for this module
    (the pool-and-job test and the dt-plan test ask for the same sizes; both only read the
    plan). The size the dev stack file already names gives the dev stack's own settings: that
    is the session's ``dev_plan``."""
    plans: dict[str, Plan] = {}

    def plan(vm_size: str) -> Plan:
        if vm_size not in plans:
            values = _values(vm_size)
            same_as_dev = values == stack_values("dev")
            plans[vm_size] = (
                request.getfixturevalue("dev_plan") if same_as_dev else evaluate("dev", values)
            )
        return plans[vm_size]

    return plan


def _job(plan, **changes) -> JobSpec:
    jobs = [r for r in plan.resources if r.typ == "pulumi-python:dynamic:Resource"]
    inputs = next(r.inputs for r in jobs if "trainer_args" in r.inputs)
    spec = JobSpec.from_props(inputs)
    return JobSpec(**{**spec.__dict__, **changes})


@pytest.mark.parametrize("vm_size", WITH_NVME + WITHOUT_NVME)
def test_the_size_table_says_which_sizes_have_local_nvme_disks(vm_size):
    size = SUPPORTED[vm_size]
    assert (size.nvme_disks, size.nvme_gib) == ((8, 28000) if vm_size in WITH_NVME else (0, 0))


@pytest.mark.parametrize("vm_size", WITH_NVME + WITHOUT_NVME)
def test_the_pool_and_the_job_put_staged_data_where_the_size_has_room(plan_of_size, vm_size):
    plan = plan_of_size(vm_size)
    start = one(plan, "azure-native:batch:Pool").inputs["startTask"]["commandLine"]
    spec = _job(plan, dataset_prefix="imagenet/v1", code_sha256="a" * 64)
    job = job_options(spec)
    task = task_options(spec)
    prep = job.job_preparation_task.command_line
    options = [prep_or_task.container_settings.container_run_options
               for prep_or_task in (job.job_preparation_task, task)]  # fmt: skip
    data_dir = trainer_command(spec)[trainer_command(spec).index("--data-dir") + 1]
    if vm_size in WITH_NVME:
        assert "mdadm --create" in start and NVME_ROOT in start
        assert all(NVME_BIND in o for o in options)
        assert f"--dest {NVME_ROOT}/datasets/imagenet/v1" in prep
        assert f"--cache-root {NVME_ROOT}/code" in prep
        assert data_dir == f"{NVME_ROOT}/datasets/imagenet/v1"
    else:
        assert "mdadm" not in start and NVME_ROOT not in start
        assert not any(NVME_ROOT in o for o in options)
        assert '--dest "${AZ_BATCH_TASK_WORKING_DIR}"/datasets/imagenet/v1' in prep
        assert "--cache-root" not in prep
        assert data_dir == "${AZ_BATCH_JOB_PREP_WORKING_DIR}/datasets/imagenet/v1"


def test_dt_plan_says_where_datasets_are_staged_and_how_much_room_there_is(plan_of_size):
    nvme = "\n".join(disk_lines(plan_of_size("Standard_ND96isr_H100_v5").settings))
    assert (
        f"Datasets and job code: staged on the local NVMe array at {NVME_ROOT} (8 disks, 28000 GiB)"
    ) in nvme
    temp = "\n".join(disk_lines(plan_of_size("Standard_ND96asr_v4").settings))
    assert "Datasets and job code: staged on the temporary disk" in temp
    assert "no local NVMe array" in temp
