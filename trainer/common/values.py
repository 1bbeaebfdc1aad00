"""How an error shows a value and a valid range: ``shown`` cuts what was typed, ``interval`` and
``within`` say the range and check a number against it. Torch-free (infra reads it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error quotes what was typed, not a
    400-digit number."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4300-digit conversion limit
        text = f"<a {value.bit_length()}-bit integer>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def hashable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    return value


def interval(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> str:
    """``[low, high]`` with its open ends as ``(`` or ``)``: how an error states a range."""
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def within(
    value: float, low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> bool:
    """Whether ``value`` is a number in the interval: the one home of "a finite number in a
    range" for settings and flags alike (NaN compares false with everything, so it is out)."""
    if isinstance(value, float) and math.isnan(value):
        return False
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    return above and below
