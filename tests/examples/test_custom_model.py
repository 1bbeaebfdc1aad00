"""The documented "Run your own model" command (docs/trainer.md), run as written on two real
workers: it trains the example package's model and dataset, checkpoints, and a run interrupted
by ``--run-steps`` and rerun ends bit for bit where the uninterrupted run does. Under FSDP the
same plug-ins train from the first run's weights (``--init-from``)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.launchers import BIN, REPO, read_metrics
from tests.support.process_tree import RUN_TAG, check_none_left, new_tag
from trainer.checkpoints import sharded as sharded_checkpoint
from trainer.checkpoints import single_file
from trainer.outputs import results

DOCS = REPO / "docs" / "trainer.md"

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]


def documented_command() -> list[str]:
    """The command of the sh block under "## Run your own model", as a shell splits it."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Run your own model") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "docs/trainer.md: no command under 'Run your own model'"
    words = shlex.split(block[1].replace("\\\n", " "), comments=True)
    assert words[0] == "torchrun" and "--nproc_per_node" in words
    return words


def run(words: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``words`` in ``cwd`` (where its relative output folder lands), the example package on
    PYTHONPATH as from the repository root, torchrun from the project's environment."""
    cwd.mkdir(parents=True, exist_ok=True)
    python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": python_path,
    }
    done = subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def final_checkpoint(output: Path) -> dict:
    found = single_file.load_latest(output / "checkpoints")
    assert found is not None
    return found[1]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> dict:
    """The documented command run once as written, to its end (4 epochs, 128 steps): its
    output, its run folder and its final checkpoint. Read by
    ``test_the_documented_command_trains_checkpoints_and_resumes_exactly`` (what it logged,
    evaluated and saved; the end an interrupted run must reach) and by
    ``test_the_plugins_under_fsdp_start_from_another_runs_weights`` (the results' weights the
    FSDP and DDP runs start from)."""
    words = documented_command()
    cwd = tmp_path_factory.mktemp("straight")
    # Tagged as a test's own runs are (no_leftover_processes): none of its processes may
    # outlive it, whichever test builds it.
    with pytest.MonkeyPatch.context() as env:
        tag = new_tag()
        env.setenv(RUN_TAG, tag)
        done = run(words, cwd)
        check_none_left(tag)
    output = cwd / words[words.index("--output-dir") + 1]
    return {"stdout": done.stdout, "output": output, "final": final_checkpoint(output)}


def test_the_documented_command_trains_checkpoints_and_resumes_exactly(tmp_path, straight_run):
    words = documented_command()
    output = Path(words[words.index("--output-dir") + 1])

    stdout = straight_run["stdout"]
    assert "stopped by epochs" in stdout and "2 worker(s)" in stdout
    full = straight_run["final"]
    evals = [r for r in read_metrics(straight_run["output"]) if r["kind"] == "eval"]
    assert len(evals) == 4 and evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert results.is_complete(straight_run["output"] / "results")

    # Interrupted mid-epoch (step 50 of 128: epoch 1, step 18 of 32), then rerun as documented.
    paused = run([*words, "--run-steps", "50"], tmp_path / "split")
    assert "stopped by run_steps" in paused.stdout
    resumed = run(words, tmp_path / "split")
    assert "at step 50 (epoch 1)" in resumed.stdout
    split = final_checkpoint(tmp_path / "split" / output)
    assert full["step"] == split["step"] == 128
    for name, tensor in full["model"].items():
        assert torch.equal(tensor, split["model"][name]), name


def test_the_plugins_under_fsdp_start_from_another_runs_weights(tmp_path, straight_run):
    words = documented_command()
    output = Path(words[words.index("--output-dir") + 1])
    # Any finished run's weights will do: the straight run's, which the other test needs too.
    weights = straight_run["output"] / "results" / "model.safetensors"

    start = ["--init-from", str(weights), "--max-steps", "2"]
    done = run([*words, "--backend", "fsdp", *start], tmp_path / "fsdp")
    assert f"init_from={weights}: started from 16 tensors (safetensors)" in done.stdout
    folders = sharded_checkpoint.list_checkpoints(tmp_path / "fsdp" / output / "checkpoints")
    assert [step for step, _ in folders] == [2]
    # The same two steps from the same weights under DDP: FSDP's shards were loaded from them
    # (equal up to the order of floating-point sums), and they are not the source's weights.
    run([*words, *start], tmp_path / "ddp")
    trained = {
        name: load_file(tmp_path / name / output / "results" / "model.safetensors")
        for name in ("fsdp", "ddp")
    }
    source = load_file(weights)
    for key, tensor in trained["ddp"].items():
        assert torch.allclose(trained["fsdp"][key], tensor, atol=1e-5), key
    assert any(not torch.allclose(source[k], t, atol=1e-5) for k, t in trained["ddp"].items())
