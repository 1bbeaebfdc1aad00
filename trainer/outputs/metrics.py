"""Rank 0's record of the run: ``metrics.jsonl``, TensorBoard events and the progress display."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from trainer.common.files import OutputError


class MetricsWriter:
    """Appends one JSON object per logged step or epoch and mirrors scalars to TensorBoard.

    Appending keeps the history of earlier, resumed invocations in the same file.
    """

    def __init__(self, output_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # A folder that cannot be created or opened is an OSError naming it: the trainer's
        # output_dir error says which user must be able to write there.
        output_dir.mkdir(parents=True, exist_ok=True)
        self.path = output_dir / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.tensorboard_dir = output_dir / "tensorboard"
        _quiet_event_writer_threads()
        try:
            # The writer writes and flushes its first event as it is made, in its writer
            # thread: a full disk there is an OSError naming no file (a run that resumes onto
            # a full disk writes nothing before it).
            with self._writing(self.tensorboard_dir):
                self._tb = SummaryWriter(str(self.tensorboard_dir))
        except OutputError:
            self._file.close()
            raise

    @staticmethod
    @contextmanager
    def _writing(where: Path) -> Iterator[None]:
        """A disk that fills up (or turns read-only) under a running job: one line naming the
        path (a write's error names no file; TensorBoard's writer thread raises it later)."""
        try:
            yield
        except OSError as err:
            raise OutputError.of(err, where) from None

    def write(self, record: dict[str, Any], tensorboard: bool = True) -> None:
        """One line of ``metrics.jsonl``; its numbers also as TensorBoard scalars unless
        ``tensorboard`` is False (per-rank records: ``scalars`` names them by rank)."""
        with self._writing(self.path):
            self._file.write(json.dumps(record, sort_keys=True) + "\n")
            self._file.flush()
        if not tensorboard:
            return
        kind = record.get("kind", "train")
        prefix = {"eval": "val"}.get(kind, kind)
        with self._writing(self.tensorboard_dir):
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "epoch"):
                    self._tb.add_scalar(f"{prefix}/{key}", value, record["step"])

    def scalars(self, values: dict[str, float], step: int) -> None:
        """TensorBoard scalars under their own tags (``ranks/step_sec/rank3``), not in the file."""
        with self._writing(self.tensorboard_dir):
            for tag, value in values.items():
                self._tb.add_scalar(tag, value, step)

    def close(self) -> None:
        """Close both; TensorBoard's writer thread stops even when the file's last flush fails
        (a full disk), so it never outlives the run's output folder."""
        try:
            with self._writing(self.path):
                self._file.close()
        finally:
            with self._writing(self.tensorboard_dir):
                self._tb.close()


def _quiet_event_writer_threads() -> None:
    """TensorBoard's event writer thread keeps a failed write's error (a full disk) for the next
    add, flush or close, which raise it here as one line, and then re-raises it, so threading's
    hook prints its traceback too. Only that thread's OSError is left unprinted; every other
    thread's uncaught error still goes to the hook before it."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    previous = threading.excepthook
    if getattr(previous, "quiet_event_writers", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.thread, _AsyncWriterThread) and isinstance(args.exc_value, OSError):
            return
        previous(args)

    hook.quiet_event_writers = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class Progress:
    """A tqdm bar on a terminal; plain lines when output goes to a pipe or a log (horovodrun
    prefixes and line-buffers each worker's output, so carriage-return bars would garble it)."""

    def __init__(
        self, start_step: int, total_steps: int, stream: TextIO = sys.stderr, unit: str = "images"
    ) -> None:
        self.total = total_steps
        self.rate_key, self.rate_label = (
            f"{unit}_per_sec",
            {
                "images": "img",
                "tokens": "tok",
                "samples": "samples",
            }[unit],
        )
        self.stream = stream
        self.started = time.monotonic()
        self.start_step = start_step
        self._bar = None
        if stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps, initial=start_step, unit="step", file=stream, dynamic_ncols=True
            )

    def update(self, step: int, record: dict[str, Any] | None) -> None:
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            if record:
                self._bar.set_postfix(
                    loss=f"{record['loss']:.4f}",
                    lr=f"{record['lr']:.4g}",
                    **{f"{self.rate_label}_s": f"{record[self.rate_key]:.0f}"},
                )
            return
        if record is None:
            return
        done = step - self.start_step
        elapsed = time.monotonic() - self.started
        eta = elapsed / done * (self.total - step) if done else 0.0
        accuracy = f"acc {record['accuracy']:.3f} " if "accuracy" in record else ""
        print(
            f"step {step}/{self.total} epoch {record['epoch']} loss {record['loss']:.4f} "
            f"{accuracy}lr {record['lr']:.4g} "
            f"{record[self.rate_key]:.1f} {self.rate_label}/s eta {eta:.0f}s",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
