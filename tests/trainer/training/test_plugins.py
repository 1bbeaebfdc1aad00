"""A team's own model, data and hooks through ``--model/--data/--loss/--metric pkg.module:name``
(trainer.training.plugins): every bad plug-in stops ``python -m trainer`` with one line naming it
and what was expected, exit 2, before anything is written; good ones train like ours.

Each bad plug-in is refused in this process (``refused``), by the step of the command that checks
plug-ins; ``python -m trainer`` itself is run once for that refusal: each run of it pays seconds of
torch's import for a one-line answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer.__main__ import _plugins
from trainer.engines.local import LocalDist
from trainer.settings.flags import parse
from trainer.training.plugins import load
from trainer.training.run import train
from trainer.watch.signals import StopRequest

REPO = Path(__file__).resolve().parents[3]

# A team's package, written into the test's folder: each factory a case below names.
TEAM_PACKAGE = """
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset


class Points(Dataset):
    def __init__(self, size=64, features=4, pair=True, label_shape=()):
        self.size, self.features, self.pair, self.label_shape = size, features, pair, label_shape

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(self.features, generator=generator)
        y = torch.full(self.label_shape, index % 3, dtype=torch.long)
        return (x, y) if self.pair else x


def data(cfg, **kwargs):
    return Points(**kwargs), Points(size=16, **kwargs)


def data_mismatched_val(cfg):
    return Points(features=4), Points(features=5)


def data_empty(cfg):
    return Points(size=0)


def data_iterable(cfg):
    class Stream(IterableDataset):
        def __iter__(self):
            yield torch.zeros(4), torch.tensor(0)
    return Stream()


def data_raises(cfg):
    raise FileNotFoundError("/data/points.csv")


def model(cfg, features=4):
    return nn.Sequential(nn.Linear(features, 8), nn.ReLU(), nn.Linear(8, cfg.num_classes))


def model_raises(cfg):
    raise ValueError("width must be even")


def model_warns_then_raises(cfg):
    import sys
    print("loading weights from /team/weights.pt", file=sys.stderr)
    raise FileNotFoundError("weights.pt")


def model_exits(cfg):
    import sys
    sys.exit("usage: model --width N")


def model_parses_argv(cfg):
    import argparse
    argparse.ArgumentParser().add_argument("--width", required=True)
    argparse.ArgumentParser(prog="model").parse_args(["--nonsense"])


def model_not_a_module(cfg):
    return {"weights": 1}


def model_foreign_units(cfg):
    net = model(cfg)
    net.sharding_units = [nn.Linear(2, 2)]
    return net


def loss_vector(outputs, targets):
    return (outputs - outputs.detach()).sum(dim=1)


def loss_mse(outputs, targets):
    return ((outputs - torch.nn.functional.one_hot(targets, outputs.shape[-1])) ** 2).mean()


def metric_always_right(outputs, targets):
    return torch.tensor(len(targets))


NOT_CALLABLE = 3
"""


@pytest.fixture(scope="module")
def team(tmp_path_factory) -> Path:
    """The folder holding the team's package ``teamcode``, for PYTHONPATH (no test changes
    it: written once for the module)."""
    root = tmp_path_factory.mktemp("team")
    (root / "teamcode").mkdir(parents=True)
    (root / "teamcode" / "__init__.py").write_text("")
    (root / "teamcode" / "plugins.py").write_text(textwrap.dedent(TEAM_PACKAGE))
    (root / "teamcode" / "broken.py").write_text("import torch\nraise RuntimeError('boom')\n")
    (root / "teamcode" / "exits.py").write_text("import sys\nsys.exit(3)\n")
    return root


@pytest.fixture
def team_importable(team: Path, monkeypatch) -> Path:
    """``team`` on this process's sys.path, for the tests that load the plug-ins in process
    (what PYTHONPATH does for the command); the package is forgotten afterwards."""
    monkeypatch.syspath_prepend(str(team))
    yield team
    for name in [n for n in sys.modules if n == "teamcode" or n.startswith("teamcode.")]:
        del sys.modules[name]


def trainer(team: Path, output: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``python -m trainer`` with the team's package on PYTHONPATH, as the docs say to run it."""
    env = {**os.environ, "PYTHONPATH": f"{team}{os.pathsep}{REPO}"}
    command = [sys.executable, "-m", "trainer", *arguments(output, *flags)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def arguments(output: Path, *flags: str) -> list[str]:
    """The command line of ``trainer`` after ``python -m trainer``."""
    return [
        "--backend",
        "local",
        "--num-classes",
        "3",
        "--batch-size",
        "8",
        "--epochs",
        "2",
        "--warmup-epochs",
        "0",
        "--loader-workers",
        "0",
        "--output-dir",
        str(output),
        *flags,
    ]


def refused(output: Path, *flags: str, capsys) -> subprocess.CompletedProcess[str]:
    """How ``trainer(team, output, *flags)`` ends for a bad plug-in, decided in this process
    (the team's package importable: ``team_importable``): the command line parsed, then the
    command's own plug-in step (trainer/__main__.py, ``_plugins``), which ends a bad one with
    ``fail``: its line on stderr, SystemExit(2). stderr also holds whatever the plug-ins wrote
    there. That the command itself ends so:
    test_the_command_ends_a_bad_plugin_with_its_one_line_and_exit_2."""
    request = parse(arguments(output, *flags))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        _plugins(request.config)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([], exit_.value.code, captured.out, captured.err)


def trained(output: Path, *flags: str):
    """``trainer(team, output, *flags)``'s training, in this process (the team's package
    importable: ``team_importable``): the plug-ins loaded and checked, then the run; its
    RunResult."""
    cfg = parse(arguments(output, *flags)).config
    plugins, _ = load(cfg)
    return train(cfg, LocalDist(), StopRequest(), plugins)


GOOD = ("--model", "teamcode.plugins:model", "--data", "teamcode.plugins:data")

# What the factory wrote before it raised is its last word, kept in the one line: the case the
# command itself is run for, since its stderr must still be that one line.
WARNS_THEN_RAISES = (
    ("--model", "teamcode.plugins:model_warns_then_raises", "--data", "teamcode.plugins:data"),
    "the factory raised FileNotFoundError: weights.pt",
    "; it wrote: loading weights from /team/weights.pt",
)

BAD = [
    (
        ("--model", "teamcode.missing:build", "--data", "teamcode.plugins:data"),
        "model=teamcode.missing:build: cannot import teamcode.missing (ModuleNotFoundError",
        "PYTHONPATH",
    ),
    (
        ("--model", "teamcode.broken:build", "--data", "teamcode.plugins:data"),
        "model=teamcode.broken:build: cannot import teamcode.broken (RuntimeError: boom)",
        "PYTHONPATH",
    ),
    (
        ("--model", "teamcode.plugins:nope", "--data", "teamcode.plugins:data"),
        "model=teamcode.plugins:nope: teamcode.plugins has no nope",
        "",
    ),
    (
        ("--model", "teamcode.plugins:NOT_CALLABLE", "--data", "teamcode.plugins:data"),
        "model=teamcode.plugins:NOT_CALLABLE: NOT_CALLABLE is a int",
        "not a function",
    ),
    (
        ("--model", "teamcode.plugins:model_raises", "--data", "teamcode.plugins:data"),
        "model=teamcode.plugins:model_raises: the factory raised ValueError: width must be even",
        "",
    ),
    WARNS_THEN_RAISES,
    (
        ("--model", "teamcode.plugins:model_exits", "--data", "teamcode.plugins:data"),
        "model=teamcode.plugins:model_exits: the factory exited (SystemExit: usage: model",
        "a plug-in's factory returns and reads no command line",
    ),
    (
        ("--model", "teamcode.plugins:model_parses_argv", "--data", "teamcode.plugins:data"),
        "model=teamcode.plugins:model_parses_argv: the factory exited (SystemExit: 2; model: "
        "error: unrecognized arguments: --nonsense)",
        "reads no command line",
    ),
    (
        ("--model", "teamcode.exits:build", "--data", "teamcode.plugins:data"),
        "model=teamcode.exits:build: the module exited (SystemExit: 3)",
        "a plug-in's module returns and reads no command line",
    ),
    (
        ("--model", "teamcode.plugins:model_not_a_module", "--data", "teamcode.plugins:data"),
        "model=teamcode.plugins:model_not_a_module: the factory returned a dict",
        "expected a torch.nn.Module",
    ),
    (
        ("--model", "teamcode.plugins:model_foreign_units", "--data", "teamcode.plugins:data"),
        "model=teamcode.plugins:model_foreign_units: sharding_units must list submodules",
        "",
    ),
    (
        ("--model", "teamcode.plugins:model", "--data", "teamcode.plugins:data_raises"),
        "data=teamcode.plugins:data_raises: the factory raised FileNotFoundError",
        "/data/points.csv",
    ),
    (
        ("--model", "teamcode.plugins:model", "--data", "teamcode.plugins:data_iterable"),
        "data=teamcode.plugins:data_iterable: the train set is a Stream",
        "expected a map-style torch.utils.data.Dataset",
    ),
    (
        ("--model", "teamcode.plugins:model", "--data", "teamcode.plugins:data_empty"),
        "data=teamcode.plugins:data_empty: the train set is empty",
        "at least one sample",
    ),
    (
        (*GOOD, "--data-args", "{pair: false}"),
        "data=teamcode.plugins:data: train[0] is a Tensor",
        "expected an (input, target) pair of tensors",
    ),
    (
        ("--model", "teamcode.plugins:model", "--data", "teamcode.plugins:data_mismatched_val"),
        "data=teamcode.plugins:data_mismatched_val: val samples have shapes [5] and []",
        "train samples [4] and []",
    ),
    (  # a dataset of the wrong shape for the model
        (*GOOD, "--data-args", "{features: 6}"),
        "model=teamcode.plugins:model: its forward on one sample of "
        "data=teamcode.plugins:data (input [1, 6]) raised RuntimeError",
        "expected the model to take a batch of the data's inputs",
    ),
    (  # targets the default loss cannot score
        (*GOOD, "--data-args", "{label_shape: [2, 2]}"),
        "the default loss (classification): on the model's outputs tensor [1, 3] and the "
        "targets [1, 2, 2]",
        "give --loss/--metric pkg.module:function",
    ),
    (
        (*GOOD, "--loss", "teamcode.plugins:loss_vector"),
        "loss=teamcode.plugins:loss_vector: returned tensor [1]",
        "expected a scalar tensor",
    ),
    (
        (*GOOD, "--model-args", "{depth: 2}"),
        "model=teamcode.plugins:model: the factory raised TypeError",
        "depth",
    ),
]


def _one_line_exit_2(done: subprocess.CompletedProcess[str], names: str, fix: str) -> None:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert names in lines[0] and fix in lines[0], lines[0]


@pytest.mark.parametrize(("flags", "names", "fix"), BAD, ids=[b[1][:60] for b in BAD])
def test_a_bad_plugin_is_one_line_exit_2_and_nothing_written(
    team_importable, tmp_path, capsys, flags, names, fix
):
    output = tmp_path / "run"
    _one_line_exit_2(refused(output, *flags, capsys=capsys), names, fix)
    assert not output.exists()


def test_the_command_ends_a_bad_plugin_with_its_one_line_and_exit_2(team, tmp_path):
    """``python -m trainer`` itself, for the refusals above that are decided in process: what
    the plug-in wrote on stderr is held back, the process's stderr is the one line."""
    flags, names, fix = WARNS_THEN_RAISES
    output = tmp_path / "run"
    _one_line_exit_2(trainer(team, output, *flags), names, fix)
    assert not output.exists()


def _dry_run_in(team: Path, command: list[str], output: Path) -> subprocess.CompletedProcess[str]:
    """``command --dry-run`` with the good plug-ins, run in the team's folder without
    PYTHONPATH (as the error for a missing package says to run it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    flags = ["--backend", "local", "--num-classes", "3", "--batch-size", "8", *GOOD]
    return subprocess.run(
        [*command, *flags, "--output-dir", str(output), "--dry-run"],
        cwd=team,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def dry_run_in_the_team_folder(team, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One ``python -m trainer --dry-run`` of the good plug-ins from the team's folder (the
    run, and its --output-dir), read by the "python -m trainer" case of
    test_a_plugin_in_the_current_folder_imports_from_the_console_script_too and by
    test_dry_run_builds_the_plugin_model_and_counts_its_parameters."""
    output = tmp_path_factory.mktemp("dry-run") / "run"
    return _dry_run_in(team, [sys.executable, "-m", "trainer"], output), output


@pytest.mark.parametrize("how", ["dt-train", "python -m trainer"])
def test_a_plugin_in_the_current_folder_imports_from_the_console_script_too(
    team, tmp_path, dry_run_in_the_team_folder, how
):
    """The error says "run from the folder holding the package": both entry points do so."""
    if how == "dt-train":
        done = _dry_run_in(team, [str(Path(sys.executable).parent / "dt-train")], tmp_path / "run")
    else:
        done, _ = dry_run_in_the_team_folder
    assert done.returncode == 0, done.stderr
    assert "config ok: teamcode.plugins:model has 67 parameters" in done.stdout


def test_dry_run_builds_the_plugin_model_and_counts_its_parameters(dry_run_in_the_team_folder):
    done, output = dry_run_in_the_team_folder
    assert done.returncode == 0, done.stderr
    # Linear(4, 8) + Linear(8, 3): 40 + 27.
    assert "config ok: teamcode.plugins:model has 67 parameters" in done.stdout
    assert not output.exists()


def _records(output: Path, kind: str) -> list[dict]:
    lines = (output / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_a_plugin_model_and_dataset_train_evaluate_and_resume(team_importable, tmp_path):
    output = tmp_path / "run"
    # The first 5 steps in process: only the resumed run needs to be the command.
    first = trained(output, *GOOD, "--run-steps", "5")
    assert first.step == 5, first
    second = trainer(team_importable, output, *GOOD)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resumed from" in second.stdout and "at step 5" in second.stdout
    train = _records(output, "train")
    assert train[-1]["step"] == 2 * (64 // 8) and "samples_per_sec" in train[-1]
    assert 0 <= train[-1]["accuracy"] <= 1
    evals = _records(output, "eval")
    assert [e["val_samples"] for e in evals] == [16, 16]
    evaluation = json.loads((output / "results" / "evaluation.json").read_text())
    assert evaluation["unit"] == "samples" and "accuracy" in evaluation


def test_a_loss_hook_without_a_metric_logs_no_accuracy_and_with_one_does(team_importable, tmp_path):
    """Both runs in process: what the run records is the trainer's choice, not the command's
    (the command trains plug-ins in test_a_plugin_model_and_dataset_train_evaluate_and_resume)."""
    loss = ("--loss", "teamcode.plugins:loss_mse", "--max-steps", "3")
    plain = trained(tmp_path / "plain", *GOOD, *loss)
    assert plain.step == 3, plain
    assert all("accuracy" not in r for r in _records(tmp_path / "plain", "train"))
    evaluation = json.loads((tmp_path / "plain" / "results" / "evaluation.json").read_text())
    assert "accuracy" not in evaluation and evaluation["loss"] > 0
    metric = ("--metric", "teamcode.plugins:metric_always_right")
    measured = trained(tmp_path / "measured", *GOOD, *loss, *metric)
    assert measured.step == 3, measured
    assert [r["accuracy"] for r in _records(tmp_path / "measured", "train")][-1] == 1.0
