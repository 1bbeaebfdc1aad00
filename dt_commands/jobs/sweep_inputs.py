"""What both kinds of ``dt-jobs sweep`` check before anything runs, each failure one line
(``SweepError``): the trainer settings they are given, the samples in one epoch, that the report's
figure can be drawn, and where the report goes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainer.common.errors import ConfigError as TrainerConfigError
from trainer.common.errors import one_line
from trainer.settings.flags import Request, parse
from trainer.settings.train_config import TrainConfig


class SweepError(RuntimeError):
    """A one-line reason the sweep cannot run; ``code`` 2 for bad input, 1 for the environment."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(one_line(message))
        self.code = code


def epoch_samples(cfg: TrainConfig, given: int | None) -> int:
    """Samples in one epoch: ``--epoch-samples``, else the synthetic data's size."""
    if given is not None:
        return given
    if cfg.data != "synthetic":
        unit = "tokens" if cfg.language_model else "images"
        raise SweepError(
            f"--epoch-samples: needed with data={cfg.data}: give the {unit} in one epoch of "
            "your dataset (1281167 for ImageNet-1k's training images)"
        )
    if not cfg.language_model:
        return cfg.synthetic_size
    if cfg.context is None:
        raise SweepError(
            f"--epoch-samples: needed for {cfg.model} without --context: give the tokens in "
            f"one epoch ({cfg.synthetic_size} synthetic samples x the tokens in each)"
        )
    return cfg.synthetic_size * cfg.context


def trainer_request(flags: Sequence[str], where: str) -> Request:
    try:
        return parse(list(flags))
    except TrainerConfigError as err:
        raise SweepError(f"{where}: {err}") from None


def check_plotting() -> None:
    """Before any run: the report's figure needs matplotlib (the project's infra extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SweepError(
            "matplotlib is not installed: the report's figure needs it (pip install "
            "'.[infra]'); nothing was started",
            1,
        ) from None


def report_folder(given: Path | None, name: str) -> Path:
    folder = given or Path("runs", "sweep", name)
    if folder.exists():
        raise SweepError(f"report={folder}: exists already; give a new folder with --report")
    return folder
