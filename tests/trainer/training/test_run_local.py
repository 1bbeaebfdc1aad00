"""End-to-end runs of the trainer in one process (the local backend)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import tiny_config as base_config
from tests.trainer.traces import recorded_steps
from trainer.checkpoints import single_file
from trainer.checkpoints.cadence import checkpoint_steps
from trainer.common.errors import ConfigError
from trainer.engines.local import LocalDist
from trainer.models.build import build_model
from trainer.outputs import results
from trainer.settings.train_config import DEFAULTS
from trainer.training.run import train
from trainer.watch.signals import StopRequest


def tiny_config(output_dir, **extra):
    return DEFAULTS.replace(**base_config(output_dir, **{"backend": "local", **extra}))


def final_weights(output_dir):
    _, state = single_file.load_latest(output_dir / "checkpoints")
    return state["model"]


def test_two_step_run_writes_metrics_tensorboard_and_checkpoint(tmp_path):
    result = train(tiny_config(tmp_path, max_steps=2, log_every=5), LocalDist())
    assert (result.step, result.stopped_by) == (2, "max_steps")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r["kind"] == "train"][-1]
    assert last["step"] == 2  # the last step is logged even off the log_every grid
    # Each save's training-visible stall; the run's last save waits until written.
    assert [(r["kind"], r["step"]) for r in records[-1:]] == [("checkpoint", 2)]
    assert records[-1]["stall_sec"] > 0
    assert {"step", "epoch", "loss", "lr", "images_per_sec"} <= set(last)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert [s for s, _ in single_file.list_checkpoints(tmp_path / "checkpoints")] == [2]
    assert result.samples_per_sec > 0
    # The results: the final checkpoint's weights, loadable into a fresh model.
    cfg = tiny_config(tmp_path, max_steps=2, log_every=5)
    assert result.results == tmp_path / "results" and results.is_complete(result.results)
    fresh = build_model(cfg.model, cfg.num_classes)
    fresh.load_state_dict(load_file(result.results / "model.safetensors"))
    for name, tensor in final_weights(tmp_path).items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    summary = json.loads((result.results / "metrics.json").read_text())
    assert summary == json.loads(json.dumps(result.summary()))
    # Mid-epoch: one more pass over the validation data evaluates the final weights.
    evaluation = json.loads((result.results / "evaluation.json").read_text())
    assert (evaluation["step"], evaluation["samples"]) == (2, cfg.synthetic_pool)
    assert evaluation["loss"] > 0 and 0 <= evaluation["accuracy"] <= 1


def test_rerun_resumes_and_counts_earlier_steps(tmp_path):
    # --profile-steps counts steps over invocations: the first records its last step, 2; the
    # resumed one 3 and 4, named by their numbers in the run.
    train(tiny_config(tmp_path, max_steps=2, profile_steps="2-4"), LocalDist())
    result = train(tiny_config(tmp_path, max_steps=5, profile_steps="2-4"), LocalDist())
    assert (result.start_step, result.step) == (2, 5)
    assert recorded_steps(tmp_path) == {"rank0": [[2], [3, 4]]}
    manifest = (tmp_path / "results" / "manifest.json").read_bytes()
    assert json.loads((tmp_path / "results" / "evaluation.json").read_text())["step"] == 5
    again = train(tiny_config(tmp_path, max_steps=5), LocalDist())
    assert again.stopped_by == "already_complete" and again.step == 5
    # The finished run's results are kept (and uploaded again by python -m trainer).
    assert again.results == tmp_path / "results"
    assert (again.results / "manifest.json").read_bytes() == manifest


def test_interrupted_mid_epoch_then_resumed_equals_uninterrupted(tmp_path):
    # 8 steps per epoch; stop at step 11 (mid-epoch 1), then finish all 3 epochs.
    train(tiny_config(tmp_path / "full", label_smoothing=0.1), LocalDist())
    first = train(tiny_config(tmp_path / "split", label_smoothing=0.1, run_steps=11), LocalDist())
    assert (first.step, first.stopped_by) == (11, "run_steps")
    assert first.results is None and not (tmp_path / "split" / "results").exists()  # paused
    second = train(tiny_config(tmp_path / "split", label_smoothing=0.1), LocalDist())
    assert (second.start_step, second.step) == (11, 24)
    full, split = final_weights(tmp_path / "full"), final_weights(tmp_path / "split")
    for name, tensor in full.items():
        assert torch.allclose(tensor.float(), split[name].float(), atol=1e-6), name


def test_stop_request_checkpoints_at_the_current_step(tmp_path):
    stop = StopRequest()
    stop.requested = True  # as the SIGTERM handler would
    result = train(tiny_config(tmp_path), LocalDist(), stop)
    assert (result.step, result.stopped_by) == (1, "signal")
    assert [s for s, _ in single_file.list_checkpoints(tmp_path / "checkpoints")] == [1]


def test_resume_with_another_model_is_refused(tmp_path):
    train(tiny_config(tmp_path, max_steps=1), LocalDist())
    with pytest.raises(ConfigError, match=r"model='resnet18'.*another --output-dir"):
        train(tiny_config(tmp_path, max_steps=2, model="resnet18"), LocalDist())


def test_folder_data_with_accumulation_and_lars(tmp_path, image_folder):
    cfg = tiny_config(
        tmp_path / "out",
        data="folder",
        data_dir=str(image_folder),
        num_classes=3,
        batch_size=2,
        accumulation_steps=2,
        optimizer="lars",
        loader_workers=0,
        epochs=1,
    )
    result = train(cfg, LocalDist())
    assert result.step == 18 // 2 // 2
    records = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert any(json.loads(r)["kind"] == "eval" for r in records)


def test_a_step_ending_an_epoch_is_checkpointed_once(tmp_path, monkeypatch):
    """checkpoint_every landing on an epoch's last step: only the epoch-end checkpoint is
    written (the periodic one would be overwritten at once: a wasted write of the whole state)."""
    written = []
    real_save = single_file.save
    monkeypatch.setattr(
        single_file,
        "save",
        lambda folder, step, state, keep: (
            written.append(step) or real_save(folder, step, state, keep)
        ),
    )
    # 64 samples / batch 8 = 8 steps per epoch; a checkpoint every 4 steps.
    train(tiny_config(tmp_path, epochs=2, checkpoint_every=4), LocalDist())
    assert written == [4, 8, 12, 16]


@pytest.mark.parametrize(
    ("extra", "every", "last"), [({"epochs": 2}, 3, 16), ({"max_steps": 13}, 5, 13)]
)
def test_a_run_checkpoints_at_the_steps_the_cadence_gives(
    tmp_path, monkeypatch, extra, every, last
):
    """The steps a run writes are ``checkpoint_steps``' (what the acceptance check expects):
    the periodic ones, each epoch's end and the stop, each step once."""
    written = []
    real_save = single_file.save
    monkeypatch.setattr(
        single_file,
        "save",
        lambda folder, step, state, keep: (
            written.append(step) or real_save(folder, step, state, keep)
        ),
    )
    train(tiny_config(tmp_path, checkpoint_every=every, **extra), LocalDist())
    # 64 samples / batch 8 = 8 steps per epoch.
    assert written == checkpoint_steps(every, last, steps_per_epoch=8)
