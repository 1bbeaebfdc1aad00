import math

import pytest

from trainer.watch.noise_scale import NoiseScale, advice


def test_exact_norms_give_the_exact_noise_scale():
    """Norms at their expectations, E|G_B|^2 = |G|^2 + tr(Sigma) / B, give back |G|^2,
    tr(Sigma) and their ratio exactly, whatever the smoothing."""
    grad_sq, trace = 2.0, 64.0
    estimate = NoiseScale(small_batch=8, big_batch=32, decay=0.9)
    for _ in range(3):
        record = estimate.update(grad_sq + trace / 8, grad_sq + trace / 32)
    assert record["grad_sq"] == pytest.approx(grad_sq)
    assert record["grad_trace"] == pytest.approx(trace)
    assert record["noise_scale"] == pytest.approx(32.0)


def test_numerator_and_denominator_are_averaged_apart_and_unbiased_from_the_start():
    estimate = NoiseScale(small_batch=1, big_batch=2, decay=0.5)
    # |G|^2 = 2 big - small; tr(Sigma) = (small - big) / (1 - 1/2) = 2 (small - big)
    first = estimate.update(3.0, 2.0)  # |G|^2 = 1, tr = 2
    assert (first["grad_sq"], first["grad_trace"], first["noise_scale"]) == (1.0, 2.0, 2.0)
    second = estimate.update(9.0, 5.0)  # |G|^2 = 1, tr = 8
    assert second["grad_trace"] == pytest.approx((0.5 * 2 * 0.5 + 0.5 * 8) / 0.75)
    assert second["noise_scale"] == pytest.approx(second["grad_trace"])  # ratio of averages


def test_a_negative_gradient_estimate_reports_no_noise_scale_yet():
    record = NoiseScale(small_batch=4, big_batch=8).update(1.0, 0.2)  # |G|^2 = -0.6
    assert record["grad_sq"] < 0 and "noise_scale" not in record


def test_one_worker_has_no_second_batch_size():
    with pytest.raises(ValueError, match="more than one worker"):
        NoiseScale(small_batch=8, big_batch=8)


def test_the_advice_names_the_batch_and_the_useful_factor():
    text = advice(2048.0, 256)
    assert text == (
        "global batch 256, noise scale ~ 2,048: scaling beyond about 8.0x the current batch "
        "gives diminishing returns"
    )
    assert not math.isnan(float(text.split("about ")[1].split("x")[0]))


def test_a_one_worker_run_refuses_to_measure_the_noise_scale_before_it_starts(tmp_path):
    """With one worker the reduced gradient is the worker's own: no second batch size. The run
    stops with one line before it creates its output folder."""
    from tests.conftest import tiny_config
    from trainer.common.errors import ConfigError
    from trainer.engines.local import LocalDist
    from trainer.settings.train_config import DEFAULTS
    from trainer.training.run import train

    cfg = DEFAULTS.replace(**tiny_config(tmp_path / "out", backend="ddp", noise_scale_every=2))
    with pytest.raises(ConfigError, match=r"noise_scale_every=2 with 1 worker: .* 2 or more"):
        train(cfg, LocalDist())
    assert not (tmp_path / "out" / "checkpoints").exists()
