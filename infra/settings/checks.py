"""How a stack setting is refused: ``ConfigError`` (one line naming the key, the value and the
fix) and the checks several sections share (a range, an IPv4 CIDR)."""

from __future__ import annotations

import ipaddress

from trainer.common.errors import OneLineValueError


class ConfigError(OneLineValueError):
    """A stack setting is invalid (apart from the trainer's own ConfigError, which a job's
    trainer file raises and the stack names with its key)."""


def in_range(key: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{key}={value}: must be in {low}..{high}")


def ipv4_network(key: str, text: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(text, strict=True)
    except ValueError as err:
        raise ConfigError(f"{key}={text!r}: not an IPv4 CIDR ({err})") from None
