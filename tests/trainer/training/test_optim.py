import math

import pytest
import torch
from torch import nn

from trainer.settings.train_config import DEFAULTS
from trainer.training.optim import (
    LARS,
    LRSchedule,
    build_lr_scheduler,
    build_optimizer,
    build_schedule,
    parameter_groups,
    scaled_lr,
)


@pytest.mark.parametrize(
    ("rule", "world", "expected"), [("linear", 8, 0.8), ("sqrt", 16, 0.4), ("none", 64, 0.1)]
)
def test_scaled_lr(rule, world, expected):
    assert scaled_lr(0.1, rule, world) == pytest.approx(expected)


def test_goyal_warmup_then_step_decay():
    # 8 workers, base 0.1, 100 steps per epoch, 5 warmup epochs, decay x0.1 at 30/60/80.
    cfg = DEFAULTS.replace(lr=0.1, warmup_epochs=5, lr_decay="step")
    schedule = build_schedule(cfg, steps_per_epoch=100, total_steps=9000, scale_factor=8)
    assert schedule.lr_at(0) == pytest.approx(0.1)
    assert schedule.lr_at(250) == pytest.approx(0.1 + 0.7 * 0.5)
    assert schedule.lr_at(500) == pytest.approx(0.8)
    assert schedule.lr_at(2999) == pytest.approx(0.8)
    assert schedule.lr_at(3000) == pytest.approx(0.08)
    assert schedule.lr_at(6000) == pytest.approx(0.008)
    assert schedule.lr_at(8000) == pytest.approx(0.0008)


def test_cosine_and_poly_decay():
    common = dict(start_lr=1.0, peak_lr=1.0, warmup_steps=10, total_steps=110, steps_per_epoch=10)
    cosine = LRSchedule(decay="cosine", **common)
    assert cosine.lr_at(10) == pytest.approx(1.0)
    assert cosine.lr_at(60) == pytest.approx(0.5)
    assert cosine.lr_at(110) == pytest.approx(0.0, abs=1e-12)
    poly = LRSchedule(decay="poly", poly_power=2.0, **common)
    assert poly.lr_at(60) == pytest.approx(0.25)
    assert poly.lr_at(500) == pytest.approx(0.0)


def test_lambda_scheduler_follows_the_schedule():
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = LRSchedule(
        start_lr=0.1, peak_lr=0.4, warmup_steps=4, total_steps=20, decay="cosine", steps_per_epoch=4
    )
    scheduler = build_lr_scheduler(optimizer, schedule)
    seen = []
    for _ in range(20):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([schedule.lr_at(s) for s in range(20)])


def test_bn_and_bias_get_no_weight_decay():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    decay, no_decay = parameter_groups(model, 1e-4)
    assert {id(p) for p in decay["params"]} == {id(model[0].weight), id(model[3].weight)}
    assert {id(p) for p in no_decay["params"]} == {
        id(model[0].bias),
        id(model[1].weight),
        id(model[1].bias),
        id(model[3].bias),
    }
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (1e-4, 0.0)


def test_lars_step_applies_the_trust_ratio():
    weight = nn.Parameter(torch.tensor([3.0, 4.0]))  # norm 5
    bias = nn.Parameter(torch.tensor([1.0]))
    weight.grad, bias.grad = torch.tensor([0.6, 0.8]), torch.tensor([0.5])  # grad norm 1
    optimizer = LARS(
        [
            {"params": [weight], "weight_decay": 0.01, "lars_adapt": True},
            {"params": [bias], "weight_decay": 0.0, "lars_adapt": False},
        ],
        lr=0.1,
        momentum=0.9,
        weight_decay=0.01,
        trust_coefficient=0.001,
    )
    optimizer.step()
    trust = 0.001 * 5.0 / (1.0 + 0.01 * 5.0 + 1e-9)
    expected_update = (torch.tensor([0.6, 0.8]) + 0.01 * torch.tensor([3.0, 4.0])) * trust
    assert torch.allclose(weight.detach(), torch.tensor([3.0, 4.0]) - 0.1 * expected_update)
    assert torch.allclose(bias.detach(), torch.tensor([1.0 - 0.1 * 0.5]))


@pytest.mark.parametrize("name", ["sgd", "adamw", "lars"])
def test_every_optimizer_trains_a_step(name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    optimizer = build_optimizer(DEFAULTS.replace(optimizer=name, lr=0.5), model)
    inputs, targets = torch.randn(16, 4), torch.randint(0, 2, (16,))
    losses = []
    for _ in range(20):
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert not any(math.isnan(v) for v in losses)


def test_scheduler_built_at_a_step_continues_the_uninterrupted_rates_bit_for_bit():
    schedule = LRSchedule(
        start_lr=0.1, peak_lr=0.4, warmup_steps=4, total_steps=20, decay="cosine", steps_per_epoch=4
    )
    seen = []
    for start in (0, 7):
        optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        scheduler = build_lr_scheduler(optimizer, schedule, start_step=start)
        rates = []
        for _ in range(20 - start):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        seen.append(rates)
    assert seen[1] == seen[0][7:]  # exact equality: a resume must not change a single bit


@pytest.mark.parametrize(
    ("rule", "peak_2", "peak_3"), [("linear", 0.2, 0.3), ("sqrt", 0.1 * 2**0.5, 0.1 * 3**0.5)]
)
def test_resumed_scheduler_follows_the_new_world_sizes_peak_not_the_saved_one(rule, peak_2, peak_3):
    cfg = DEFAULTS.replace(lr=0.1, lr_scaling=rule, warmup_epochs=1, lr_decay="cosine")
    model = nn.Linear(2, 2)
    # Written by 2 workers at step 6 (8 steps per epoch): its optimizer and scheduler state
    # carry the 2-worker peak.
    old = build_schedule(cfg, steps_per_epoch=8, total_steps=24, scale_factor=2)
    assert old.peak_lr == pytest.approx(peak_2)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    old_scheduler = build_lr_scheduler(optimizer, old, start_step=6)
    saved_optimizer, saved_scheduler = optimizer.state_dict(), old_scheduler.state_dict()
    # Resumed on 3 workers (5 steps per epoch), at schedule step 3.
    new = build_schedule(cfg, steps_per_epoch=5, total_steps=15, scale_factor=3)
    assert new.peak_lr == pytest.approx(peak_3)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    optimizer.load_state_dict(saved_optimizer)
    # What loading the saved scheduler state would do: the old peak times the new fraction.
    stale = build_lr_scheduler(optimizer, new)
    stale.load_state_dict(saved_scheduler)
    optimizer.step()
    stale.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(peak_2 * new.lr_at(7) / peak_3)
    optimizer.load_state_dict(saved_optimizer)
    scheduler = build_lr_scheduler(optimizer, new, start_step=3)
    warmup = 0.1 + (peak_3 - 0.1) * 3 / 5
    assert optimizer.param_groups[0]["lr"] == pytest.approx(warmup) == new.lr_at(3)
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 + (peak_3 - 0.1) * 4 / 5)
    assert [g["initial_lr"] for g in optimizer.param_groups] == [new.peak_lr]


def test_no_scaling_keeps_the_peak_on_any_world_size():
    cfg = DEFAULTS.replace(lr=0.1, lr_scaling="none")
    for world in (1, 2, 3):
        assert build_schedule(cfg, 5, 15, scale_factor=world).peak_lr == 0.1
