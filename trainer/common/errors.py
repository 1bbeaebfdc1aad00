"""The one-line error style every part of the trainer (and infra, dt_commands) speaks: the
first line of an exception, text with its control characters escaped, and the bad-value error
that says the setting, the value and the fix in one line."""

from __future__ import annotations


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a
    one-line error or warning quotes of it."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def one_line(text: str) -> str:
    """``text`` with newlines and other control characters escaped: errors stay one line even
    when they quote what the user typed."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class OneLineValueError(ValueError):
    """A bad value, said in one line for the user (``one_line`` escapes what it quotes)."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class ConfigError(OneLineValueError):
    """A trainer setting has an invalid value."""
