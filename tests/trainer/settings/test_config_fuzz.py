"""Config fuzzing: thousands of generated stack and trainer configs. Every invalid one ends in
a one-line ConfigError that names a setting (never another exception, so never a traceback),
and the offline plan of an invalid stack declares nothing."""

import contextlib
import io
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dt_commands import plan as plan_module
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from infra.settings.values import load_schema
from tests.support.stacks import stack_values
from trainer.common.errors import ConfigError as TrainerConfigError
from trainer.settings.flags import parse
from trainer.settings.train_config import FIELD_NAMES, TrainConfig

SCHEMA = load_schema()
DEV = {key.removeprefix("gpu-cluster:"): value for key, value in stack_values("dev").items()}
# 500 examples per test (1000 before): half the time, for make test's 15-minute budget.
FUZZ = settings(max_examples=500, suppress_health_check=list(HealthCheck))

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**7),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            "0",
            "-1",
            "true",
            "10.0.0.0/8",
            "0.0.0.0/0",
            "100.64.0.1",
            "20.1.2.4/32",
            "c" * 300,
            "a<b",
            "Standard_NC24rs_v3",
            "eastus",
            "sha256:abc",
            "../x",
            "a\nb",
            "[1, 2]",
            "azurefiles",
            "docker",
        ]
    ),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3))


def _names_a_setting(message: str, known: set[str]) -> bool:
    """``key=value: ...``, ``key: ...`` or ``unknown setting '<key>'``."""
    if message.startswith("unknown setting "):
        return True
    match = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)[=:]", message)
    return bool(match) and match.group(1) in known


@FUZZ
@given(
    overrides=st.dictionaries(
        st.one_of(st.sampled_from(sorted(SCHEMA)), st.text(min_size=1, max_size=12)),
        values,
        max_size=4,
    )
)
def test_stack_config(overrides):
    mapping = {**DEV, **overrides}
    try:
        StackSettings.from_mapping("fuzz", mapping, SCHEMA)
    except ConfigError as err:
        message = str(err)
        assert "\n" not in message, message
        assert _names_a_setting(message, set(SCHEMA) | set(mapping)), message
        declared = []
        real = plan_module.AzureMocks.new_resource

        def record(self, args):
            declared.append(args.name)
            return real(self, args)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(plan_module.AzureMocks, "new_resource", record)
            with pytest.raises(ConfigError):
                plan_module.evaluate("fuzz", mapping)
        assert declared == []


@FUZZ
@given(
    mapping=st.dictionaries(
        st.one_of(st.sampled_from(FIELD_NAMES), st.text(min_size=1, max_size=12)),
        values,
        max_size=5,
    )
)
def test_trainer_config(mapping):
    try:
        TrainConfig.from_mapping(mapping)
    except TrainerConfigError as err:
        message = str(err)
        assert "\n" not in message, message
        assert _names_a_setting(message, set(FIELD_NAMES) | set(mapping)), message


flags = st.sampled_from(["--" + name.replace("_", "-") for name in FIELD_NAMES])


@FUZZ
@given(
    argv=st.lists(
        st.one_of(flags, st.text(max_size=12), st.sampled_from(["-1", "0", "x"])), max_size=6
    )
)
def test_trainer_command_line(argv):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parse(argv)
    except TrainerConfigError as err:
        assert "\n" not in str(err), str(err)
    except SystemExit as exit_:
        assert exit_.code == 2
        assert stderr.getvalue().count("\n") == 1, stderr.getvalue()
