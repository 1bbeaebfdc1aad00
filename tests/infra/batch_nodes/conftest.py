"""The Batch node emulator's fixtures (tests/batch_emulator/fixtures.py) for these tests."""

from tests.batch_emulator.fixtures import (  # noqa: F401 (fixtures and a hook, found by name)
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
