"""Run under horovodrun or torchrun: the noise scale of a problem with a known answer, measured
through the engine's own hooks (``Dist.wrap_model`` / ``wrap_optimizer`` / ``optimizer_step``
with a ``GradientProbe``), as the trainer measures it.

Usage: noise_probe.py BACKEND STEPS REPORT_JSON. Linear regression y = w*.x + e with x ~ N(0, I_d)
and e ~ N(0, s^2), loss 1/2 (w.x - y)^2, at w = w* + delta (learning rate 0: w stays there). The
per-example gradient is g = (delta.x - e) x, so G = E[g] = delta and, by Isserlis' theorem,
Sigma = (|delta|^2 + s^2) I + delta delta^T: tr(Sigma) = d (|delta|^2 + s^2) + |delta|^2, and
B_simple = tr(Sigma) / |delta|^2 exactly.
"""

import json
import sys

import torch
from rank_report import threads_left_after_shutdown  # beside this script (on sys.path)
from torch import nn

from trainer.engines.base import GradientProbe
from trainer.engines.choose import init_dist
from trainer.settings.train_config import TrainConfig
from trainer.watch.noise_scale import NoiseScale

DIM, NOISE_STD, PER_WORKER = 8, 1.0, 4


def exact_noise_scale(delta: torch.Tensor) -> float:
    delta_sq = float(delta.pow(2).sum())
    return (DIM * (delta_sq + NOISE_STD**2) + delta_sq) / delta_sq


def main() -> None:
    backend, steps, report = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    # Horovod's 1 ms cycle: the many tiny allreduces here are latency-bound.
    cfg = TrainConfig(backend=backend, horovod_cycle_time_ms=1.0, device="cpu")
    dist = init_dist(cfg)
    torch.manual_seed(0)  # the same w* and delta on every rank
    target = torch.randn(DIM)
    delta = torch.nn.functional.normalize(torch.randn(DIM), dim=0)  # |delta| = 1
    model = nn.Linear(DIM, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(target + delta)
    probe = GradientProbe(torch.device("cpu"))
    wrapped = dist.wrap_model(model, cfg, probe)
    optimizer = dist.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.0), model, cfg, probe)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    estimate = NoiseScale(PER_WORKER, PER_WORKER * dist.size, decay=0.999)
    generator = torch.Generator().manual_seed(1000 + dist.rank)  # each rank its own samples
    record: dict[str, float] = {}
    for _ in range(steps):
        x = torch.randn(PER_WORKER, DIM, generator=generator)
        y = x @ target + NOISE_STD * torch.randn(PER_WORKER, generator=generator)
        probe.start()
        loss = 0.5 * (wrapped(x).squeeze(1) - y).pow(2).mean()
        loss.backward()
        dist.optimizer_step(optimizer, scaler, 0.0, probe)
        optimizer.zero_grad()
        local_sq = dist.allreduce_sum(probe.local_sq).item() / dist.size
        record = estimate.update(local_sq, probe.reduced_sq.item())
    dist.shutdown()
    # With the DDP module still referenced here, as a caller's variable holds it.
    threads = threads_left_after_shutdown(backend)
    if dist.is_root:
        with open(report, "w") as out:
            exact = exact_noise_scale(delta)
            json.dump({**record, "exact": exact, "size": dist.size, "threads": threads}, out)


if __name__ == "__main__":
    main()
