"""Model FLOPs utilisation (MFU): the training FLOPs a run does per second (6N per token,
``trainer.models.gpt_sizes.flops_per_token``) against what the device can do at most.

Peaks are dense bf16 tensor-core figures from NVIDIA's datasheets (the "with sparsity" figures
are twice these): H100 SXM5 989.4 TFLOPS (the ND H100 v5's GPU), H200 989.4 (the same compute
as the H100 SXM), A100 SXM 312. On a device not listed (a CPU, another GPU) the peak is unknown
and MFU is not reported; the achieved TFLOPS still are.
"""

from __future__ import annotations

PEAK_DENSE_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a device named like ``torch.cuda.get_device_name()`` (for
    example "NVIDIA H100 80GB HBM3"), or None when it is not known."""
    return next((peak for gpu, peak in PEAK_DENSE_BF16_TFLOPS.items() if gpu in device_name), None)


def throughput_metrics(
    tokens_per_sec: float, flops_per_token: int, peak: float | None
) -> dict[str, float]:
    """Per-worker achieved model TFLOPS, and MFU where the device's peak is known."""
    tflops = tokens_per_sec * flops_per_token / 1e12
    return {"model_tflops": tflops, **({"mfu": tflops / peak} if peak else {})}
