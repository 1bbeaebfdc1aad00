import subprocess
import sys

import pytest

from trainer.settings.flags import build_parser, parse
from trainer.settings.train_config import FIELD_NAMES


def run_cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_every_setting_has_a_flag_with_help():
    helps = {
        action.dest: action.help
        for action in build_parser()._actions
        if action.dest in FIELD_NAMES and action.help
    }
    assert set(helps) == set(FIELD_NAMES)


def test_flags_override_the_yaml_file(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("model: resnet18\nbatch_size: 16\nlr_step_epochs: [5, 9]\n")
    request = parse(["--config", str(config), "--batch-size", "8", "--fp16-allreduce"])
    cfg = request.config
    assert (cfg.model, cfg.batch_size, cfg.lr_step_epochs, cfg.fp16_allreduce) == (
        "resnet18",
        8,
        (5, 9),
        True,
    )
    assert request.dry_run is False


def test_dry_run_reports_resnet50_parameters():
    result = run_cli("--model", "resnet50", "--num-classes", "1000", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "25,557,032 parameters" in result.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["--batch-size", "0"], "batch_size=0: must be in 1..65536"),
        (["--optimizer", "rmsprop"], "optimizer='rmsprop': must be one of sgd, adamw, lars"),
        (["--config", "missing.yaml"], "config=missing.yaml: cannot read"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, expected, tmp_path):
    result = run_cli(*args, "--output-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["--help"], ["--batch-size", "0"]])
def test_help_and_a_bad_setting_answer_before_torch_is_imported(args):
    """Answered as soon as the settings are read, not after torch's import (seconds)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "trainer", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "trainer.settings.flags" in imported, result.stderr[-2000:]
    assert "torch" not in imported


def test_unknown_yaml_key_is_rejected(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("model: resnet18\nlearning_rate: 0.1\n")
    result = run_cli("--config", str(config), "--dry-run")
    assert result.returncode == 2
    assert "unknown setting 'learning_rate'" in result.stderr


def test_yaml_that_is_not_a_mapping_is_rejected(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("- a\n- b\n")
    result = run_cli("--config", str(config), "--dry-run")
    assert result.returncode == 2
    assert "must be a mapping" in result.stderr


def test_bad_data_dir_fails_before_any_output(tmp_path):
    result = run_cli(
        "--backend",
        "local",
        "--data",
        "folder",
        "--data-dir",
        str(tmp_path / "nope"),
        "--output-dir",
        str(tmp_path / "out"),
    )
    assert result.returncode == 2
    assert f"data folder {tmp_path / 'nope' / 'train'} does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_to_flags_reproduces_the_settings_it_was_given():
    from trainer.settings.flags import parse, to_flags
    from trainer.settings.train_config import TrainConfig

    values = {
        "model": "resnet18",
        "batch_size": 64,
        "fp16_allreduce": True,
        "compile": False,
        "lr_step_epochs": [30, 60],
        "lr": 0.2,
        "max_steps": None,
    }
    assert parse(to_flags(values)).config == TrainConfig.from_mapping(values)
    assert to_flags({"compile": False}) == ["--no-compile"]
