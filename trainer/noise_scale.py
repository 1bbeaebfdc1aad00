"""The gradient noise scale, measured while training: how large a batch is still useful.

McCandlish, Kaplan, Amodei 2018 ("An Empirical Model of Large-Batch Training",
arXiv:1812.06162): the simple noise scale B_simple = tr(Sigma) / |G|^2, where G is the true
gradient and Sigma the per-example gradients' covariance. Batches much larger than B_simple give
diminishing returns: each doubling of the batch then buys less than a doubling of progress per
step.

Appendix A.1 estimates both terms from gradient norms at two batch sizes, which data-parallel
training has for free: each worker's own gradient (B_small = its samples per step) and the
reduced one (B_big = the global batch). Since E|G_B|^2 = |G|^2 + tr(Sigma) / B,

    |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

Each is noisy, and their ratio is biased when taken per step, so the paper averages numerator and
denominator separately (an exponential moving average of each here) and divides the averages.

The local norms are taken where the engine already holds the local gradients (a DDP
communication hook, a Horovod compression hook: ``trainer.distributed.GradientProbe``), so no
extra backward pass runs. |G_small|^2 is the mean of the workers' squared norms. This module
imports no torch: the job CLI prints the same advice from the uploaded metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Smoothing of the two estimates: about the last 1 / (1 - 0.95) = 20 measurements count.
EMA_DECAY = 0.95


@dataclass
class NoiseScale:
    """B_simple from one measurement per call, smoothed (see the module docstring)."""

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
