"""The one error every data module raises for data that cannot be used (a folder or disk that
cannot take what a writer makes is ``trainer.common.files.OutputError``)."""

from __future__ import annotations


class DataError(ValueError):
    """The data on disk cannot be used; the message is one line naming the path."""
