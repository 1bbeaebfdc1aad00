"""Checkpoint writes in the background: a short copy of the state (``HostStaging``, with
``StepFence`` making the next ``optimizer.step()`` wait for the part it would change), then one
write in flight at a time on a thread (``BackgroundWriter``). Why and how: docs/trainer.md.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from trainer.common.errors import first_line


def _storage(tensor: torch.Tensor) -> int:
    """The address of the memory a tensor (or a DTensor's local shard) lives in: views of a
    parameter (``state_dict()`` entries) share their parameter's."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return tensor.untyped_storage().data_ptr()


class StepFence:
    """Makes ``optimizer.step()`` wait for the copy of the state in flight, if any.

    Registered as an optimizer step pre-hook, so the wait cannot be forgotten by any code path
    that steps. At most one copy is held: holding a second one first waits for the first.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer
        self._copy: Future[Any] | None = None
        optimizer.register_step_pre_hook(self._before_step)

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.wait()

    def guarded(self) -> set[int]:
        """The storages ``step()`` changes in place: the parameters it steps on and its state
        (momentum, moments, AdamW's step count)."""
        tensors = [p for group in self._optimizer.param_groups for p in group["params"]]
        for state in self._optimizer.state.values():
            tensors.extend(v for v in state.values() if torch.is_tensor(v))
        return {_storage(t) for t in tensors}

    def hold(self, copy: Future[Any]) -> None:
        """The next ``step()`` waits for ``copy`` (ours, or DCP's staging)."""
        self.wait()
        self._copy = copy

    def wait(self) -> None:
        """Block until the copy in flight ends. A failed copy is not raised here: the write
        that reads it fails with it, and that error stops every rank together."""
        copy, self._copy = self._copy, None
        if copy is not None:
            concurrent.futures.wait([copy])


def snapshot_unguarded(value: Any, guarded: set[int]) -> Any:
    """``value`` with every tensor the optimizer's step does not change replaced by a copy on
    its own device (forward may change those, e.g. BatchNorm's running statistics, before the
    fence); the guarded ones are left for a copy that overlaps the next step."""
    if torch.is_tensor(value):
        return value if _storage(value) in guarded else value.detach().clone()
    if isinstance(value, dict):
        return {k: snapshot_unguarded(v, guarded) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot_unguarded(v, guarded) for v in value)
    return value


class HostStaging:
    """Host copies of a state dict's tensors, allocated at the first save and reused.

    ``stage`` copies the tensors the fence does not guard at once and the guarded ones on a
    background thread, which the fence then holds. Each save overwrites the previous save's
    copy: its write must have finished first (``BackgroundWriter.wait``).
    """

    def __init__(self, fence: StepFence, device: torch.device) -> None:
        self._fence = fence
        # A device-to-host copy into pinned memory can run asynchronously (and faster).
        self._pinned = device.type == "cuda"
        self._device = device
        self._stream = torch.cuda.Stream(device) if self._pinned else None
        self._tensors: dict[tuple[Any, ...], torch.Tensor] = {}
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-copy")

    def stage(self, state: Any) -> Future[Any]:
        """The future of ``state``'s copy, in the staging tensors (non-tensor values are kept
        as they are, in fresh containers)."""
        self._fence.wait()
        now: list[tuple[torch.Tensor, torch.Tensor]] = []
        later: list[tuple[torch.Tensor, torch.Tensor]] = []
        staged = self._place(state, (), self._fence.guarded(), now, later)
        self._copy(now, None)
        if self._stream is not None:
            # The background copies run on their own stream, after the work that produced
            # the tensors (the last step) and beside the next step's kernels.
            self._stream.wait_stream(torch.cuda.current_stream(self._device))

        def copy_the_rest() -> Any:
            self._copy(later, self._stream)
            return staged

        copy = self._thread.submit(copy_the_rest)
        self._fence.hold(copy)
        return copy

    def _place(
        self,
        value: Any,
        path: tuple[Any, ...],
        guarded: set[int],
        now: list[tuple[torch.Tensor, torch.Tensor]],
        later: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> Any:
        if torch.is_tensor(value):
            target = self._tensors.get(path)
            if (
                target is None
                or target.shape != value.shape
                or target.dtype != value.dtype
                or target.stride() != value.stride()
            ):
                target = torch.empty_like(value, device="cpu", pin_memory=self._pinned)
                self._tensors[path] = target
            (later if _storage(value) in guarded else now).append((target, value.detach()))
            return target
        if isinstance(value, dict):
            return {k: self._place(v, (*path, k), guarded, now, later) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(
                self._place(v, (*path, i), guarded, now, later) for i, v in enumerate(value)
            )
        return value

    def _copy(
        self,
        pairs: list[tuple[torch.Tensor, torch.Tensor]],
        stream: torch.cuda.Stream | None,
    ) -> None:
        if not self._pinned:
            for target, source in pairs:
                target.copy_(source)
            return
        with torch.cuda.device(self._device), torch.cuda.stream(stream):
            for target, source in pairs:
                target.copy_(source, non_blocking=True)
            torch.cuda.current_stream().synchronize()  # one synchronisation for all of them

    def close(self) -> None:
        self._fence.wait()
        self._thread.shutdown(wait=True)


class BackgroundWriter:
    """One background thread; at most one checkpoint write in flight on it."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._in_flight: Future[None] | None = None

    @property
    def busy(self) -> bool:
        return self._in_flight is not None

    def submit(self, write: Callable[[], None]) -> None:
        if self._in_flight is not None:
            raise RuntimeError("a checkpoint write is already in flight; wait() for it first")
        self._in_flight = self._executor.submit(write)

    def wait(self) -> str | None:
        """Block until the write in flight (if any) ends; its error as one line, or None."""
        future, self._in_flight = self._in_flight, None
        if future is None:
            return None
        try:
            future.result()
        except Exception as err:  # reported on every rank by the caller, as one line
            return first_line(err)
        return None

    def close(self) -> None:
        """Finish the write in flight (the process must not exit halfway through a file)."""
        self._executor.shutdown(wait=True)
