"""``--on-bad-image fail|skip``: what a sample that does not decode does to a run.

A corrupt image is found where it is decoded: in a DataLoader worker process, or while a
decoded cache fills. An exception raised in a worker reaches the training process as a
multi-line "Caught ... in DataLoader worker process" report, so a worker never raises for one:
it serves the next sample that decodes in its place (a batch keeps its shape) and names the bad
one beside the batch. The training process then stops with one line naming it and the fix
(``fail``, the default: a dataset with a corrupt file is usually a broken copy), or counts it
and warns once per file (``skip``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from trainer.data.errors import DataError

log = logging.getLogger(__name__)

# How far a worker looks past a bad sample for one that decodes: further means a broken
# dataset, not a bad file, and is one error.
MAX_REPLACEMENT_SEARCH = 64
# What repairs a bad image of each kind of data (``--data``).
FIXES = {
    "folder": "replace or delete that file",
    "shards": "prepare the shards again (`dt-data prepare` checks every image) "
    "and stage them again",
}
T = TypeVar("T")


class BadImages:
    """One rank's policy and count; its loaders report every replaced sample here."""

    def __init__(self, policy: str = "fail", fix: str = FIXES["folder"]) -> None:
        self.policy, self.fix = policy, fix
        self.skipped = 0
        self._warned: set[str] = set()

    def error(self, problem: str) -> DataError:
        return DataError(f"{problem}; {self.fix}, or train past it with --on-bad-image skip")

    def met(self, problems: Sequence[str]) -> None:
        """A batch's problems ("" for each sample served as it is)."""
        for problem in problems:
            if not problem:
                continue
            if self.policy == "fail":
                raise self.error(problem)
            self.skipped += 1
            if problem not in self._warned:
                self._warned.add(problem)
                log.warning("skipped: %s (--on-bad-image skip)", problem)


def first_decodable(get: Callable[[int], T], index: int, count: int) -> tuple[T, str]:
    """``get(index)``, or when that raises a ``DataError`` ``get`` of the next index (wrapping
    around) that does not; with the first error's message ("" when ``index`` itself served)."""
    problem = ""
    for step in range(min(count, MAX_REPLACEMENT_SEARCH)):
        try:
            return get((index + step) % count), problem
        except DataError as err:
            problem = problem or str(err)
    raise DataError(
        f"{problem}; and the {min(count, MAX_REPLACEMENT_SEARCH) - 1} samples after it do not "
        "decode either: the dataset is damaged, prepare or copy it again"
    )


def worker_error(err: DataError) -> DataError:
    """A ``DataError`` a DataLoader worker raised, as its own one line (the loader re-raises
    it with the worker's whole traceback as the message)."""
    lines = str(err).strip().splitlines()
    if not lines or not lines[0].startswith("Caught DataError in DataLoader worker"):
        return err
    return DataError(lines[-1].partition("DataError: ")[2] or lines[-1])
