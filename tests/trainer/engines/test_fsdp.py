"""FSDP2 (``--backend fsdp``) in real multi-process runs on 127.0.0.1 with Gloo: sharded
training, sharded checkpoints, resume on the same and on other numbers of ranks (DCP
resharding), an incomplete checkpoint never loaded, hybrid sharding on a 2-D mesh, and the
README's run on token shards, whose DataLoader workers end with it.

Ranks are started the way torchrun and ``trainer.launch`` start them: RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT in each process's environment, so a
test can give 4 ranks "nodes" of 2 (LOCAL_WORLD_SIZE=2) on one machine.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_config
from tests.support.launchers import REPO, read_metrics
from tests.support.ports import free_port
from trainer.checkpoints import sharded as sharded_checkpoint
from trainer.outputs import results
from trainer.settings.flags import to_flags

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

REPORT = str(Path(__file__).parents[1] / "rank_report.py")


def spawn_ranks(
    world: int, args: list[str], cwd: Path, local_size: int | None = None
) -> list[subprocess.Popen[str]]:
    """``world`` processes running ``python args`` as one torch.distributed job."""
    local_size = local_size or world
    port = str(free_port())
    processes = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank % local_size),
            "LOCAL_WORLD_SIZE": str(local_size),
            "GROUP_RANK": str(rank // local_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, *args],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return processes


def wait_ranks(processes: list[subprocess.Popen[str]]) -> str:
    """Their combined output once all exited 0 (none is left running)."""
    outputs = []
    try:
        for process in processes:
            out, _ = process.communicate(timeout=240)
            outputs.append(out)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    output = "\n".join(outputs)
    assert all(p.returncode == 0 for p in processes), output[-4000:]
    return output


def start_ranks(world: int, args: list[str], cwd: Path, local_size: int | None = None) -> str:
    return wait_ranks(spawn_ranks(world, args, cwd, local_size))


# gpt-tiny on short synthetic windows: transformer blocks to shard one by one and no batch
# statistics, so any number of ranks computes the same global batch's loss. A global batch of
# 12 windows: 1 x 12, 2 x 6, 3 x 4 or 4 x 3; 8 steps, checkpoints after steps 3 and 6.
GLOBAL_BATCH = 12
LM_RUN = dict(
    model="gpt-tiny",
    context=16,
    backend="fsdp",
    optimizer="adamw",
    lr=0.003,
    weight_decay=0.01,
    lr_scaling="none",  # the same rate on any number of ranks
    warmup_epochs=0,
    synthetic_size=96,
    epochs=1,
    log_every=1,
    checkpoint_every=3,
)
STEPS = 96 // GLOBAL_BATCH
# Float32 sums taken in another order (reduce-scatters over other numbers of ranks) drift a
# little over the steps; the differences measured here are about 1e-6 relative.
TOLERANCE = 1e-4


def lm_config(output_dir: Path, world: int, **extra) -> dict:
    return tiny_config(output_dir, **{**LM_RUN, "batch_size": GLOBAL_BATCH // world, **extra})


def report(world: int, config: dict, reports: Path, cwd: Path, **launch) -> list[dict]:
    """Train with ``rank_report.py``: each rank's world, step, full-parameter digest, mesh."""
    reports.mkdir(exist_ok=True)
    start_ranks(world, [REPORT, str(reports), json.dumps(config)], cwd, **launch)
    return [json.loads((reports / f"rank-{r}.json").read_text()) for r in range(world)]


def train_losses(output_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(output_dir) if r["kind"] == "train"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """Two FSDP ranks straight through: their losses, final digest and checkpoints."""
    root = tmp_path_factory.mktemp("reference")
    reports = report(2, lm_config(root / "out", 2), root / "reports", REPO)
    assert reports[0]["mesh"] == [2]
    assert reports[0]["params_sha256"] == reports[1]["params_sha256"]
    checkpoints = root / "out" / "checkpoints"
    assert [s for s, _ in sharded_checkpoint.list_checkpoints(checkpoints)] == [8, 6, 3]
    files = sorted(p.name for p in sharded_checkpoint.checkpoint_path(checkpoints, 3).iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "complete", "trainer_state.pt"]
    return {
        "losses": train_losses(root / "out"),
        "params_sha256": reports[0]["params_sha256"],
        "checkpoints": checkpoints,
    }


def test_the_results_hold_the_final_weights_gathered_from_every_ranks_shards(reference, tmp_path):
    """Rank 0 gathered the full state dict (every rank taking part) into results/: a fresh
    model loads it and holds the final checkpoint's weights, the parameters both ranks ended
    with; the evaluation is the run's last, at the epoch's end."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from tests.trainer.rank_report import named_tensors_sha256
    from trainer.data.text_prepare import BYTE_VOCAB
    from trainer.models.build import build_model

    output = reference["checkpoints"].parent
    folder = output / results.RESULTS_DIR
    assert results.is_complete(folder)
    weights = load_file(folder / results.WEIGHTS)
    model = build_model(LM_RUN["model"], BYTE_VOCAB)  # synthetic tokens: byte-level
    model.load_state_dict(weights)
    assert named_tensors_sha256(model.named_parameters()) == reference["params_sha256"]
    final = sharded_checkpoint.checkpoint_path(reference["checkpoints"], STEPS)
    dcp_to_torch_save(final, tmp_path / "final.pt")
    saved = torch.load(tmp_path / "final.pt", weights_only=True)["model"]
    assert saved.keys() == weights.keys()
    assert all(torch.equal(weights[name], tensor) for name, tensor in saved.items())
    evaluation = json.loads((folder / results.EVALUATION).read_text())
    last = [r for r in read_metrics(output) if r["kind"] == "eval"][-1]
    assert (evaluation["step"], evaluation["unit"]) == (STEPS, "tokens")
    assert (evaluation["loss"], evaluation["samples"]) == (last["val_loss"], last["val_samples"])
    assert evaluation["perplexity"] == pytest.approx(math.exp(last["val_loss"]))


def resume_from_step_3(reference: dict, output_dir: Path) -> None:
    """A run folder holding only the reference's checkpoint after step 3."""
    step_3 = sharded_checkpoint.checkpoint_path(reference["checkpoints"], 3)
    shutil.copytree(step_3, sharded_checkpoint.checkpoint_path(output_dir / "checkpoints", 3))


def test_two_fsdp_ranks_compute_the_losses_of_one_process_on_the_same_global_batch(
    reference, tmp_path, repo
):
    start_ranks(1, ["-m", "trainer", *to_flags(lm_config(tmp_path, 1))], repo)
    one = train_losses(tmp_path)
    assert len(one) == STEPS
    assert reference["losses"] == pytest.approx(one, rel=TOLERANCE)


def test_a_resumed_fsdp_run_ends_with_the_parameters_of_one_that_ran_straight_through(
    reference, tmp_path, repo
):
    resume_from_step_3(reference, tmp_path / "out")
    resumed = report(2, lm_config(tmp_path / "out", 2), tmp_path / "reports", repo)
    assert resumed[0]["step"] == STEPS
    assert {r["params_sha256"] for r in resumed} == {reference["params_sha256"]}
    assert train_losses(tmp_path / "out") == reference["losses"][3:]


@pytest.mark.parametrize("world", [1, 3])
def test_a_checkpoint_from_two_ranks_resumes_on_another_number_of_ranks(
    world, reference, tmp_path, repo
):
    """DCP reshards the 2 ranks' shards onto 1 or 3: the losses go on as the 2 ranks' did, so
    the parameters and the optimizer state were loaded whole."""
    resume_from_step_3(reference, tmp_path)
    output = start_ranks(world, ["-m", "trainer", *to_flags(lm_config(tmp_path, world))], repo)
    assert f"resized: checkpoint from 2 workers resumed on {world}" in output
    assert train_losses(tmp_path) == pytest.approx(reference["losses"][3:], rel=TOLERANCE)


def test_hybrid_sharding_on_two_nodes_of_two_ranks_trains_as_sharding_over_all(
    reference, tmp_path, repo
):
    """--shard-within node (the default) on 4 ranks in nodes of 2: a (replicate 2, shard 2)
    mesh, and the losses of ZeRO-3 over every rank."""
    config = lm_config(tmp_path / "out", 4, checkpoint_every=0)
    hybrid = report(4, config, tmp_path / "reports", repo, local_size=2)
    assert [r["mesh"] for r in hybrid] == [[2, 2]] * 4
    assert len({r["params_sha256"] for r in hybrid}) == 1
    assert train_losses(tmp_path / "out") == pytest.approx(reference["losses"], rel=TOLERANCE)


def test_a_checkpoint_without_its_marker_is_never_loaded(tmp_path, repo):
    """A crash between the shard writes and the marker leaves a folder without ``complete``:
    the resume takes the previous checkpoint, and the next save removes the incomplete one.
    ResNet-18 with activation checkpointing and clipping: residual blocks sharded one by one,
    BN buffers (replicated, not sharded) saved and loaded too."""
    config = tiny_config(
        tmp_path / "out",
        model="resnet18",
        backend="fsdp",
        synthetic_size=96,
        run_steps=4,
        checkpoint_every=2,
        keep_checkpoints=3,
        grad_clip_norm=1.0,
        activation_checkpointing=True,
    )
    start_ranks(2, ["-m", "trainer", *to_flags(config)], repo)
    checkpoints = tmp_path / "out" / "checkpoints"
    assert [s for s, _ in sharded_checkpoint.list_checkpoints(checkpoints)] == [4, 2]
    crashed = sharded_checkpoint.checkpoint_path(checkpoints, 4)
    (crashed / sharded_checkpoint.COMPLETE).unlink()
    output = start_ranks(2, ["-m", "trainer", *to_flags({**config, "run_steps": 1})], repo)
    assert "step-000000002.dcp at step 2" in output
    steps = [s for s, _ in sharded_checkpoint.list_checkpoints(checkpoints)]
    assert steps == [3, 2] and not crashed.exists()


def test_sigterm_while_checkpoints_are_written_in_the_background_ends_with_a_complete_one(
    tmp_path, repo
):
    """A save every step, each written in the background while the next step trains: a
    SIGTERM mid-run waits for the write in flight, saves the step it stopped at, and exits 0
    with every checkpoint complete and nothing half-written left."""
    # ResNet-18 with AdamW: 135 MB of state per save, written while the next steps train.
    config = tiny_config(
        tmp_path,
        model="resnet18",
        backend="fsdp",
        optimizer="adamw",
        lr=0.001,
        synthetic_size=640,
        epochs=1,
        log_every=1,
        checkpoint_every=1,
        keep_checkpoints=2,
    )
    processes = spawn_ranks(2, ["-m", "trainer", *to_flags(config)], repo)
    deadline = time.monotonic() + 180
    while not any(r["kind"] == "checkpoint" and r["step"] >= 2 for r in read_metrics(tmp_path)):
        assert all(p.poll() is None for p in processes), "the run ended before the signal"
        assert time.monotonic() < deadline, "no second checkpoint within 3 minutes"
        time.sleep(0.05)
    processes[1].send_signal(signal.SIGTERM)  # one rank: the stop reaches both
    output = wait_ranks(processes)
    assert "stopped by signal" in output
    checkpoints = tmp_path / "checkpoints"
    stopped = max(r["step"] for r in read_metrics(tmp_path) if r["kind"] == "train")
    assert stopped < 640 // 16
    assert next(s for s, _ in sharded_checkpoint.list_checkpoints(checkpoints)) == stopped
    assert all(sharded_checkpoint.is_complete(f) for f in checkpoints.iterdir())
    state = sharded_checkpoint.read_trainer_state(
        sharded_checkpoint.checkpoint_path(checkpoints, stopped)
    )
    assert state["step"] == stopped


def test_the_readmes_fsdp_run_on_token_shards_leaves_no_data_worker_behind(tmp_path, repo):
    """The README's FSDP command as it stands (torchrun, gpt-tiny on ``prepare-text``'s token
    shards, two ranks), each rank with DataLoader workers started from its forkserver. FSDP's
    ranks end without the interpreter's teardown (``Dist.teardown_safe``): no loader worker and
    no forkserver may outlive them (``no_leftover_processes`` checks every process of the run).
    The output goes to a file: a leftover holding a pipe open would hang the test instead."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(2):
        (corpus / f"doc{i}.txt").write_text("The quick brown fox. " * 200, encoding="utf-8")
    tokens = tmp_path / "tokens"
    prepare = [sys.executable, "-m", "trainer.data", "prepare-text", str(corpus), str(tokens)]
    prepared = subprocess.run(prepare, cwd=repo, capture_output=True, text=True, timeout=120)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    config = lm_config(
        tmp_path / "out", 2, data="tokens", data_dir=str(tokens), loader_workers=2, max_steps=4
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command = [*torchrun, "--nproc_per_node", "2", "-m", "trainer", *to_flags(config)]
    log = tmp_path / "torchrun.log"
    with log.open("w") as output:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        ran = subprocess.run(
            command, cwd=repo, env=env, stdout=output, stderr=subprocess.STDOUT, timeout=300
        )
    assert ran.returncode == 0, log.read_text()[-4000:]
    assert "done: step 4" in log.read_text()
