"""GPU telemetry (``--gpu-telemetry-seconds``): each rank samples the GPU it trains on.
Why it is built this way: docs/internals.md, `trainer/watch/gpu_telemetry.py`."""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

log = logging.getLogger(__name__)

# One rank's GPU over a window, in this order (NaN: not measured or not supported).
FIELDS = (
    "utilization_pct",  # mean over the window's samples
    "memory_used_gb",  # the window's highest
    "memory_total_gb",
    "temperature_c",  # the window's highest
    "power_w",  # mean
    "ecc_uncorrected",  # volatile count (since the driver loaded)
    "xid_events",  # critical XID events seen since the sampler started
)
# Polling NVML's event set in slices this long lets close() stop the thread promptly.
_EVENT_SLICE_MS = 500


@dataclass
class _Window:
    utilization: list[float] = field(default_factory=list)
    memory_used: list[float] = field(default_factory=list)
    temperature: list[float] = field(default_factory=list)
    power: list[float] = field(default_factory=list)
    memory_total: float = math.nan
    ecc: float = math.nan


class GpuSampler:
    """Samples one GPU through ``nvml`` (pynvml or a module with its API) on a daemon thread."""

    def __init__(self, nvml: ModuleType, index: int, seconds: float) -> None:
        self.nvml, self.index, self.seconds = nvml, index, seconds
        self._lock = threading.Lock()
        self._window = _Window()
        self._last: list[float] | None = None
        self._xids = 0
        self.failed: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)

    def start(self) -> GpuSampler:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and self.failed is None

    def take(self) -> list[float]:
        """The window since the last call in ``FIELDS`` order; the latest window again when no
        sample arrived since; NaN once the sampler stopped."""
        with self._lock:
            if self.failed is not None:
                return [math.nan] * len(FIELDS)
            w, self._window = self._window, _Window()
            if w.utilization:
                self._last = [
                    _mean(w.utilization),
                    max(w.memory_used),
                    w.memory_total,
                    max(w.temperature),
                    _mean(w.power),
                    w.ecc,
                ]
            if self._last is None:
                return [math.nan] * len(FIELDS)
            return [*self._last, float(self._xids)]

    def close(self) -> None:
        """Stop the thread; waits at most a little longer than one event slice (a thread stuck
        in an NVML call is a daemon and does not hold the process)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * _EVENT_SLICE_MS / 1000)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
            events = self._xid_events(handle)
            while not self._stop.is_set():
                self._sample(handle)
                self._wait(events)
        except Exception as err:  # whatever NVML raises, the sampler must never end the run
            self.failed = f"{type(err).__name__}: {err}"
            log.warning(
                "gpu telemetry: NVML failed on GPU %d (%s); no more GPU samples in this run",
                self.index,
                self.failed,
            )
        finally:
            # Shutting down after a failure may fail too.
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()

    def _xid_events(self, handle: Any) -> Any:
        """An event set delivering this GPU's critical XIDs, or None where NVML cannot (then
        the thread sleeps between samples and counts no XIDs)."""
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
        except nvml.NVMLError as err:
            log.info("gpu telemetry: XID events unavailable on GPU %d (%s)", self.index, err)
            return None
        return events

    def _sample(self, handle: Any) -> None:
        nvml = self.nvml
        utilization = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        temperature = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        ecc = self._optional(
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        with self._lock:
            w = self._window
            w.utilization.append(float(utilization))
            w.memory_used.append(memory.used / 1e9)
            w.memory_total = memory.total / 1e9
            w.temperature.append(float(temperature))
            w.power.append(power_mw / 1000)
            w.ecc = ecc

    def _optional(self, call: Any, *args: Any) -> float:
        """A reading some GPUs do not offer (ECC off, no power sensor): NaN there."""
        try:
            return float(call(*args))
        except self.nvml.NVMLError_NotSupported:
            return math.nan

    def _wait(self, events: Any) -> None:
        """Until the next sample: counting XID events as they arrive, or just sleeping."""
        if events is None:
            self._stop.wait(self.seconds)
            return
        nvml, left_ms = self.nvml, int(self.seconds * 1000)
        while left_ms > 0 and not self._stop.is_set():
            slice_ms = min(left_ms, _EVENT_SLICE_MS)
            left_ms -= slice_ms
            try:
                data = nvml.nvmlEventSetWait(events, slice_ms)
            except nvml.NVMLError_Timeout:
                continue
            if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                with self._lock:
                    self._xids += 1
                log.warning("gpu telemetry: XID %s on GPU %d", data.eventData, self.index)


def _mean(values: list[float]) -> float:
    present = [v for v in values if not math.isnan(v)]
    return sum(present) / len(present) if present else math.nan


def start_sampler(device: torch.device, seconds: float) -> GpuSampler | None:
    """A running sampler of ``device``'s GPU, or None: telemetry off, a CPU device (nothing is
    imported), or NVML unavailable (one warning line)."""
    if not seconds or device.type != "cuda":
        return None
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        log.warning("gpu telemetry: the pynvml module (nvidia-ml-py) is not installed; off")
        return None
    try:
        nvml.nvmlInit()
        index = _nvml_index(nvml, device)
    except Exception as err:  # NVMLError or a broken library: never fatal
        log.warning("gpu telemetry: NVML did not start (%s: %s); off", type(err).__name__, err)
        return None
    return GpuSampler(nvml, index, seconds).start()


def _nvml_index(nvml: ModuleType, device: torch.device) -> int:
    """NVML's index of this CUDA device. CUDA numbers the visible devices fastest first and
    NVML all devices in PCI order, so the UUID decides where torch knows it."""
    cuda_index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
    if uuid is not None:
        handle = nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        return int(nvml.nvmlDeviceGetIndex(handle))
    return cuda_index
