"""The pack refuses a job that waits for a debugger (trainer setting debug_rank) on a production
stack unless the stack sets allowDebugger: checked on the program's own plan of the production
stack, and on hand-made resources for what counts as production."""

import pytest
import yaml

from infra.settings.values import REPO
from policy.rules import JOB, POOL
from tests.policy.test_rules import check_stack


def violations(resources):
    return check_stack(resources, "no-debugger-on-production")


def debugging_trainer_config(tmp_path, rank=1):
    """The stack's default trainer settings with a rank that waits for a debugger."""
    settings = yaml.safe_load((REPO / "trainer/presets/resnet50-cluster.yaml").read_text())
    path = tmp_path / "debug.yaml"
    path.write_text(yaml.safe_dump({**settings, "debug_rank": rank}))
    return str(path)


def test_a_production_stack_refuses_a_waiting_job_unless_it_allows_the_debugger(tmp_path):
    from dt_commands.plan import evaluate
    from tests.support.stacks import stack_values

    values = stack_values("vision-prod") | {
        "gpu-cluster:trainerConfig": debugging_trainer_config(tmp_path)
    }
    plan = evaluate("vision-prod", values)
    refused = violations([(r.typ, r.inputs) for r in plan.resources])
    assert len(refused) == 1, refused
    assert "debug_rank=1 on production stack vision-prod (every rank waits" in refused[0]
    assert refused[0].endswith("or set gpu-cluster:allowDebugger true")

    allowed = evaluate("vision-prod", values | {"gpu-cluster:allowDebugger": True})
    pools = [r.inputs for r in allowed.resources if r.typ == POOL]
    assert {"name": "debugger", "value": "allowed"} in pools[0]["metadata"]
    assert violations([(r.typ, r.inputs) for r in allowed.resources]) == []


POOL_PROPS = {"metadata": [{"name": "checkpointing", "value": "true"}]}


@pytest.mark.parametrize(
    ("stack", "refused"),
    [
        ("vision-prod", True),
        ("prod", True),
        ("vision-production", True),
        ("dev", False),
        ("vision-dev", False),
        ("product-search", False),
        ("acceptance-cpu-20261101-120000", False),
    ],
)
def test_production_is_a_stack_named_prod_or_production(stack, refused):
    job = {"stack": stack, "trainer_args": ["--model", "resnet50", "--debug-rank", "0"]}
    assert bool(violations([(POOL, POOL_PROPS), (JOB, job)])) is refused


def test_a_job_without_debug_rank_passes_on_production():
    job = {"stack": "vision-prod", "trainer_args": ["--model", "resnet50", "--debug-port", "5678"]}
    assert violations([(POOL, POOL_PROPS), (JOB, job)]) == []
