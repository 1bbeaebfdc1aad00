"""--profile-steps: the window's syntax and the profiler's action at each step (the traces a
real run writes are checked in tests/trainer/watch/test_debugger_two_workers.py and
tests/trainer)."""

import pytest
import torch
from torch.profiler import ProfilerAction

from trainer.common.errors import ConfigError
from trainer.settings.checks import profile_window
from trainer.settings.train_config import TrainConfig
from trainer.watch.profiling import profiling, step_schedule, trace_folder


@pytest.mark.parametrize(
    ("text", "window"), [("20-25", (20, 25)), (" 7 - 7 ", (7, 7)), ("1-1", (1, 1))]
)
def test_a_window_is_first_and_last_step(text, window):
    assert profile_window(text) == window
    assert TrainConfig.from_mapping({"profile_steps": text}).profile_steps == text


@pytest.mark.parametrize("text", ["0-3", "5-3", "5", "-5", "a-b", "1-2-3", "1-" + "9" * 13])
def test_anything_else_is_one_line_naming_the_setting_and_the_form(text):
    with pytest.raises(ConfigError) as caught:
        TrainConfig.from_mapping({"profile_steps": text})
    message = str(caught.value)
    assert message.startswith("profile_steps=") and "A-B with 0 < A <= B" in message
    assert "\n" not in message


def test_the_window_from_yaml_is_text_and_a_bare_number_is_refused():
    # YAML reads 20-25 as a string, 20 as an integer: the setting takes it as "20".
    with pytest.raises(ConfigError, match="profile_steps='20'"):
        TrainConfig.from_mapping({"profile_steps": 20})


def test_the_step_before_the_window_warms_up_and_its_last_step_saves():
    action = step_schedule(3, 5)
    assert [action(step) for step in range(1, 8)] == [
        ProfilerAction.NONE,
        ProfilerAction.WARMUP,
        ProfilerAction.RECORD,
        ProfilerAction.RECORD,
        ProfilerAction.RECORD_AND_SAVE,
        ProfilerAction.NONE,
        ProfilerAction.NONE,
    ]
    one = step_schedule(1, 1)
    assert [one(step) for step in (0, 1, 2)] == [
        ProfilerAction.WARMUP,
        ProfilerAction.RECORD_AND_SAVE,
        ProfilerAction.NONE,
    ]


def test_a_window_after_the_runs_end_says_so_and_records_nothing(tmp_path, caplog):
    with profiling("5-6", tmp_path, 0, torch.device("cpu"), steps_done=0, end_step=4) as profiler:
        assert profiler is None
    assert [r.getMessage() for r in caplog.records] == [
        "profile_steps=5-6: the run ends at step 4; no trace is recorded"
    ]
    assert not trace_folder(tmp_path).exists()


def test_a_window_before_a_resume_is_not_profiled_again(tmp_path, caplog):
    with profiling("2-3", tmp_path, 0, torch.device("cpu"), steps_done=3, end_step=9) as profiler:
        assert profiler is None
    assert not caplog.records


def test_the_profiler_numbers_steps_as_the_run_does(tmp_path):
    """After 6 steps (a resume), the invocation's first step is the profiler's step 7."""
    with profiling("8-9", tmp_path, 0, torch.device("cpu"), steps_done=6, end_step=9) as profiler:
        assert profiler is not None and profiler.step_num == 7
