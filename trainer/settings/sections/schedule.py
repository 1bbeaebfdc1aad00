"""How long a run trains, the optimizer, and its learning-rate schedule; each field checked
here. ``lr`` is the single-worker rate, scaled by the number of workers (``lr_scaling``)."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.common.errors import ConfigError
from trainer.common.values import shown
from trainer.settings.checks import check_choice, check_float_range, check_int_range
from trainer.settings.choices import LR_DECAYS, LR_SCALINGS, MAX_EPOCHS, MAX_STEPS, OPTIMIZERS
from trainer.settings.declare import setting


@dataclass(frozen=True)
class ScheduleSettings:
    """How long, and how fast."""

    epochs: int = setting(90, "epochs to train")
    max_steps: int | None = setting(
        None, "stop when the global optimizer step reaches N (steps before a resume count)"
    )
    run_steps: int | None = setting(
        None, "stop this invocation after N more steps (checkpoint, exit 0, resume later)"
    )
    lr: float = setting(0.1, "single-worker learning rate, scaled by --lr-scaling")
    optimizer: str = setting("sgd", f"{', '.join(OPTIMIZERS)}")
    momentum: float = setting(0.9, "momentum for sgd and lars")
    weight_decay: float = setting(1e-4, "L2 penalty (never applied to BN and bias parameters)")
    lars_trust_coefficient: float = setting(0.001, "LARS trust coefficient (eta)")
    lr_scaling: str = setting("linear", f"scale lr with workers: {', '.join(LR_SCALINGS)}")
    warmup_epochs: float = setting(
        5.0, "linear warmup from --lr to the scaled rate (Goyal et al. 2017)"
    )
    lr_decay: str = setting("step", f"after warmup: {', '.join(LR_DECAYS)}")
    lr_step_epochs: tuple[int, ...] = setting(
        (30, 60, 80), "epochs where step decay multiplies the rate, comma-separated"
    )
    lr_step_factor: float = setting(0.1, "step decay multiplier")
    lr_poly_power: float = setting(2.0, "poly decay exponent")
    label_smoothing: float = setting(0.0, "label smoothing for the cross-entropy loss")

    def check_schedule(self) -> None:
        """How long to train, then the optimizer with its learning-rate schedule."""
        check_int_range("epochs", self.epochs, 1, MAX_EPOCHS)
        if self.max_steps is not None:
            check_int_range("max_steps", self.max_steps, 1, MAX_STEPS)
        if self.run_steps is not None:
            check_int_range("run_steps", self.run_steps, 1, MAX_STEPS)
        check_float_range("lr", self.lr, 0.0, 1000.0, low_open=True)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_float_range("momentum", self.momentum, 0.0, 1.0, high_open=True)
        check_float_range("weight_decay", self.weight_decay, 0.0, 1.0)
        check_float_range(
            "lars_trust_coefficient", self.lars_trust_coefficient, 0.0, 1.0, low_open=True
        )
        check_choice("lr_scaling", self.lr_scaling, LR_SCALINGS)
        check_float_range("warmup_epochs", self.warmup_epochs, 0.0, float(self.epochs))
        check_choice("lr_decay", self.lr_decay, LR_DECAYS)
        if list(self.lr_step_epochs) != sorted(set(self.lr_step_epochs)) or any(
            not 1 <= e <= MAX_EPOCHS for e in self.lr_step_epochs
        ):
            raise ConfigError(
                f"lr_step_epochs={shown(list(self.lr_step_epochs))}: must be increasing epochs "
                f"in 1..{MAX_EPOCHS}"
            )
        check_float_range("lr_step_factor", self.lr_step_factor, 0.0, 1.0, low_open=True)
        check_float_range("lr_poly_power", self.lr_poly_power, 0.0, 10.0, low_open=True)
        check_float_range("label_smoothing", self.label_smoothing, 0.0, 1.0, high_open=True)
