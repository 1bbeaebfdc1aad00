"""What the project's dynamic providers (the training job, the image build, the registry's
task bypass) share: which inputs a diff compares.

Pulumi passes the provider itself, serialized, as the ``__provider`` input; editing provider
code must never replace a resource, so keys starting with ``__`` are never compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def changed_inputs(
    olds: Mapping[str, Any],
    news: Mapping[str, Any],
    ignore: Iterable[str],
    defaults: Mapping[str, Any] | None = None,
) -> list[str]:
    """The keys of ``news`` whose value differs from ``olds``, leaving out ``ignore`` (outputs,
    settings that are not the resource) and ``__`` keys. ``defaults``: the value an input added
    in a later version has when older state lacks it."""
    skipped, defaults = set(ignore), defaults or {}
    return [
        key
        for key in news
        if key not in skipped
        and not key.startswith("__")
        and olds.get(key, defaults.get(key)) != news.get(key)
    ]
