"""The gradient noise scale, measured while training: how large a batch is still useful.
Why it is built this way: docs/internals.md, `trainer/watch/noise_scale.py`."""

from __future__ import annotations

from dataclasses import dataclass, field

# Smoothing of the two estimates: about the last 1 / (1 - 0.95) = 20 measurements count.
EMA_DECAY = 0.95


@dataclass
class NoiseScale:
    """B_simple from one measurement per call, smoothed (docs/internals.md,
    `trainer/watch/noise_scale.py`)."""

    small_batch: int  # samples behind each worker's gradient
    big_batch: int  # samples behind the reduced gradient: the global batch
    decay: float = EMA_DECAY
    # Exponential moving sums of |G|^2 and tr(Sigma), and of the weights they carry: their
    # ratio is the average without the bias toward zero of a sum that starts at zero.
    _grad_sq: float = field(default=0.0, init=False)
    _trace: float = field(default=0.0, init=False)
    _weight: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.small_batch < self.big_batch:
            raise ValueError(
                f"the noise scale needs two batch sizes: {self.small_batch} per worker and "
                f"{self.big_batch} in all (more than one worker)"
            )

    def update(self, small_sq: float, big_sq: float) -> dict[str, float]:
        """Fold in one measurement (mean squared local norm, squared reduced norm); the
        smoothed |G|^2, tr(Sigma) and, once |G|^2 is positive, B_simple."""
        b_small, b_big = self.small_batch, self.big_batch
        grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        trace = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
        keep, add = self.decay, 1 - self.decay
        self._grad_sq = keep * self._grad_sq + add * grad_sq
        self._trace = keep * self._trace + add * trace
        self._weight = keep * self._weight + add
        smoothed_grad_sq, smoothed_trace = self._grad_sq / self._weight, self._trace / self._weight
        record = {"grad_sq": smoothed_grad_sq, "grad_trace": smoothed_trace}
        if smoothed_grad_sq > 0:
            record["noise_scale"] = smoothed_trace / smoothed_grad_sq
        return record


def advice(noise_scale: float, global_batch: int) -> str:
    """The one line the run's summary and the job status print."""
    return (
        f"global batch {global_batch}, noise scale ~ {noise_scale:,.0f}: scaling beyond about "
        f"{max(noise_scale / global_batch, 0):.1f}x the current batch gives diminishing returns"
    )
