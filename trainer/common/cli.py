"""The command-line style of every program here (the trainer, the launcher, the data tools,
dt-jobs, dt-plan, the benchmarks): argparse that fails in one line with exit code 2, and
number arguments checked against their range."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

from trainer.common.errors import one_line
from trainer.common.values import interval, shown, within


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, exit code 2 (argparse's code), no usage block.
        self.exit(2, f"error: {one_line(message)} (see --help)\n")


# Digits an integer flag may have: more is never a count or a size, and int() of over 4300
# digits raises its own ValueError.
_MAX_DIGITS = 30


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type for an integer in ``low..high``. argparse turns its error into one line
    naming the flag, exit 2, before the command does anything."""

    def integer(text: str) -> int:
        digits = text.strip().removeprefix("-")
        usable = digits.isascii() and digits.isdigit() and len(digits) <= _MAX_DIGITS
        if usable and low <= (value := int(text)) <= high:
            return value
        raise argparse.ArgumentTypeError(f"{shown(text)}: give an integer in {low}..{high}")

    return integer


def number_in(
    low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    """An argparse type for a finite number in an interval (``trainer.common.values.within``): NaN,
    infinities and values out of range are one line naming the flag, exit 2."""
    ends = {"low_open": low_open, "high_open": high_open}

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not within(value, low, high, **ends):
            raise argparse.ArgumentTypeError(
                f"{shown(text)}: give a number in {interval(low, high, **ends)}"
            )
        return value

    return number


def fail(message: str, code: int) -> NoReturn:
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
    raise SystemExit(code)
