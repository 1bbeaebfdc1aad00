"""GPU telemetry against a fake ``pynvml`` (nvidia-ml-py's module and API: functions raise
``NVMLError`` subclasses, ``nvmlEventSetWait`` raises ``NVMLError_Timeout`` when no event came;
see trainer/watch/gpu_telemetry.py), installed through ``sys.modules``. No GPU and no NVML here."""

from __future__ import annotations

import logging
import math
import sys
import threading
import types
from types import SimpleNamespace

import pytest
import torch

from trainer.watch import gpu_telemetry
from trainer.watch.gpu_telemetry import FIELDS, GpuSampler, start_sampler


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):  # pynvml's names
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


def fake_nvml(
    *,
    samples_before_lost: int | None = None,
    ecc: bool = True,
    xids: int = 0,
    events: bool = True,
    init_fails: bool = False,
) -> types.ModuleType:
    """A module with pynvml's names: one GPU at 80 % utilisation, 30 of 80 GB, 60 C, 400 W."""
    nvml = types.ModuleType("pynvml")
    state = SimpleNamespace(samples=0, xids_left=xids, shutdown=False, sampled=threading.Event())
    nvml.state = state
    nvml.NVMLError, nvml.NVMLError_Timeout = NVMLError, NVMLError_Timeout
    nvml.NVMLError_NotSupported, nvml.NVMLError_GpuIsLost = (
        NVMLError_NotSupported,
        NVMLError_GpuIsLost,
    )
    nvml.NVML_TEMPERATURE_GPU, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    nvml.NVML_VOLATILE_ECC, nvml.nvmlEventTypeXidCriticalError = 0, 0x8

    def init():
        if init_fails:
            raise NVMLError("Driver Not Loaded")

    def handle_by_index(index):
        return ("gpu", index)

    def utilization(handle):
        if samples_before_lost is not None and state.samples >= samples_before_lost:
            raise NVMLError_GpuIsLost("GPU is lost")
        state.samples += 1
        state.sampled.set()
        return SimpleNamespace(gpu=80 + state.samples % 2 * 10, memory=40)

    def total_ecc(handle, error_type, counter):
        if not ecc:
            raise NVMLError_NotSupported("Not Supported")
        return 2

    def event_set_create():
        if not events:
            raise NVMLError_NotSupported("Not Supported")
        return "set"

    def event_wait(event_set, timeout_ms):
        if state.xids_left:
            state.xids_left -= 1
            return SimpleNamespace(eventType=0x8, eventData=79, device=("gpu", 0))
        threading.Event().wait(min(timeout_ms, 5) / 1000)
        raise NVMLError_Timeout("Timeout")

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: setattr(state, "shutdown", True)
    nvml.nvmlDeviceGetCount = lambda: 1
    nvml.nvmlDeviceGetHandleByIndex = handle_by_index
    nvml.nvmlDeviceGetUtilizationRates = utilization
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=30e9, total=80e9, free=50e9)
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 60
    nvml.nvmlDeviceGetPowerUsage = lambda h: 400_000  # milliwatts
    nvml.nvmlDeviceGetTotalEccErrors = total_ecc
    nvml.nvmlEventSetCreate = event_set_create
    nvml.nvmlDeviceRegisterEvents = lambda handle, types_, event_set: None
    nvml.nvmlEventSetWait = event_wait
    return nvml


def sampled(nvml, count: int) -> None:
    """Wait until the fake has answered ``count`` utilisation reads. The flag is cleared before
    the count is read: a sample between the two would otherwise be lost (and the next one may
    be an hour away)."""
    while True:
        nvml.state.sampled.clear()
        if nvml.state.samples >= count:
            return
        assert nvml.state.sampled.wait(10), "the sampler thread never sampled"


def closed(sampler: GpuSampler) -> None:
    """``close()`` bounds its own wait; the test waits for the thread's end itself, however late
    a busy machine runs it (without the stop the thread would sleep out its whole period)."""
    sampler.close()
    sampler._thread.join(30)


def test_a_window_summarises_the_samples_and_counts_xid_events():
    nvml = fake_nvml(xids=2)
    sampler = GpuSampler(nvml, 0, seconds=0.01).start()
    try:
        sampled(nvml, 3)
        values = dict(zip(FIELDS, sampler.take(), strict=True))
    finally:
        closed(sampler)
    assert 80 <= values["utilization_pct"] <= 90
    assert (values["memory_used_gb"], values["memory_total_gb"]) == (30.0, 80.0)
    assert (values["temperature_c"], values["power_w"], values["ecc_uncorrected"]) == (60, 400, 2)
    assert values["xid_events"] == 2
    assert nvml.state.shutdown


def test_readings_a_gpu_does_not_offer_are_nan_and_without_events_it_still_samples():
    nvml = fake_nvml(ecc=False, events=False)
    sampler = GpuSampler(nvml, 0, seconds=0.01).start()
    try:
        sampled(nvml, 2)
        values = dict(zip(FIELDS, sampler.take(), strict=True))
    finally:
        sampler.close()
    assert math.isnan(values["ecc_uncorrected"]) and values["xid_events"] == 0
    assert values["temperature_c"] == 60


def test_a_gpu_that_stops_answering_is_one_warning_and_the_sampler_stops(caplog):
    nvml = fake_nvml(samples_before_lost=2)
    with caplog.at_level(logging.WARNING, logger="trainer.watch.gpu_telemetry"):
        sampler = GpuSampler(nvml, 3, seconds=0.01).start()
        sampler._thread.join(10)
    assert not sampler.running
    [record] = caplog.records
    assert record.getMessage() == (
        "gpu telemetry: NVML failed on GPU 3 (NVMLError_GpuIsLost: GPU is lost); "
        "no more GPU samples in this run"
    )
    assert record.exc_info is None  # no traceback
    assert all(math.isnan(v) for v in sampler.take())  # no stale samples once stopped
    assert nvml.state.shutdown
    sampler.close()


def test_the_latest_window_is_repeated_until_a_new_sample_arrives():
    nvml = fake_nvml()
    sampler = GpuSampler(nvml, 0, seconds=3600)  # one sample, then a long wait
    sampler.start()
    try:
        sampled(nvml, 1)
        first = sampler.take()
        assert sampler.take() == first
    finally:
        closed(sampler)
    assert not sampler._thread.is_alive()  # the stop ended the hour's wait


def test_a_cpu_device_imports_nothing_and_starts_no_thread(monkeypatch):
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    threads = threading.active_count()
    assert start_sampler(torch.device("cpu"), 10.0) is None
    assert "pynvml" not in sys.modules and threading.active_count() == threads


def test_telemetry_off_on_a_gpu_starts_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    assert start_sampler(torch.device("cuda", 0), 0) is None


def test_without_the_module_or_with_nvml_failing_to_start_it_is_one_warning(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with caplog.at_level(logging.WARNING, logger="trainer.watch.gpu_telemetry"):
        assert start_sampler(torch.device("cuda", 0), 10.0) is None
        monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_fails=True))
        assert start_sampler(torch.device("cuda", 0), 10.0) is None
    assert [r.getMessage() for r in caplog.records] == [
        "gpu telemetry: the pynvml module (nvidia-ml-py) is not installed; off",
        "gpu telemetry: NVML did not start (NVMLError: Driver Not Loaded); off",
    ]


def test_on_a_gpu_the_sampler_reads_the_device_nvml_names(monkeypatch):
    nvml = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(gpu_telemetry, "_nvml_index", lambda nvml, device: device.index)
    sampler = start_sampler(torch.device("cuda", 5), 0.01)
    assert sampler is not None
    try:
        sampled(nvml, 1)
        assert sampler.index == 5 and sampler.running
    finally:
        sampler.close()


@pytest.mark.parametrize("uuid", ["0f6a3d2c-1111-2222-3333-444455556666", None])
def test_the_nvml_index_follows_the_uuid_where_torch_knows_it(monkeypatch, uuid):
    nvml = fake_nvml()
    nvml.nvmlDeviceGetHandleByUUID = lambda text: ("uuid", text)
    nvml.nvmlDeviceGetIndex = lambda handle: 6 if handle == ("uuid", f"GPU-{uuid}") else -1
    props = SimpleNamespace(uuid=uuid) if uuid else SimpleNamespace()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    # CUDA's device 1 (fastest first) is NVML's 6 (PCI order) when the UUID says so.
    assert gpu_telemetry._nvml_index(nvml, torch.device("cuda", 1)) == (6 if uuid else 1)
