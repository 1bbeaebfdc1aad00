"""The Batch node emulator's fixtures (tests/batch_emulator/fixtures.py) for these tests, and the
runs that tests of several files here read (shared_runs.py)."""

from tests.batch_emulator.fixtures import (  # noqa: F401 (fixtures and a hook, found by name)
    built_image,
    cpu_stack,
    dataset_prefix,
    gpu_stack,
    image,
    make_cluster,
    pool_spec,
    pytest_runtest_makereport,
    spot_cpu_stack,
    stacks,
    storage,
    vnet,
)
from tests.infra.batch_nodes.shared_runs import (  # noqa: F401 (fixtures, found by name)
    retried_elsewhere_then_kept_out,
    run_under_kill,
    run_under_survive_shared_node,
    run_under_survive_shared_task,
    shared_pools,
)
