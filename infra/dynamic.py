"""What the project's dynamic providers (the training job, the image build, the registry's
task bypass) share: which inputs a diff compares, and how a refusal reaches the user.

Pulumi passes the provider itself, serialized, as the ``__provider`` input; editing provider
code must never replace a resource, so keys starting with ``__`` are never compared.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pulumi.dynamic import (
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)

from trainer.common.errors import one_line


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


class OneLineError(RuntimeError):
    """A provider's refusal or failure, meant for the user as it is: one line naming the
    resource, what went wrong and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


# Pulumi's provider host (pulumi/dynamic/__main__.py, ``_abort_with_traceback``) answers every
# exception a provider method raises with ``context.abort(UNKNOWN, traceback.format_exc())``,
# and the engine prints that status message as the resource's error
# (sdk/go/common/util/rpcutil/rpcerror): a multi-line traceback. No exception type escapes it
# (a BaseException would leave the call unanswered until the engine's deadline). So a
# ``OneLineError`` is reported the way the host itself reports an unimplemented method: the
# call's status is set on its gRPC context (set_code/set_details) and the method returns a
# neutral result, which the client never sees behind the error status.
_NEUTRAL: dict[str, Callable[..., Any]] = {
    "check": lambda olds, news: CheckResult(dict(news), []),
    "diff": lambda id_, olds, news: DiffResult(),
    "create": lambda props: CreateResult("", {}),
    "read": lambda id_, props: ReadResult(id_, {}),
    "update": lambda id_, olds, news: UpdateResult({}),
    "delete": lambda id_, props: None,
}


def _host_call_context() -> Any | None:
    """The gRPC context of the host's call this thread serves (the ``context`` argument of the
    host's servicer method up the stack); None outside the host (tests, Pulumi's mocks)."""
    import grpc

    frame = inspect.currentframe()
    while frame is not None:
        context = frame.f_locals.get("context")
        if isinstance(context, grpc.ServicerContext):
            return context
        frame = frame.f_back
    return None


def _reporting(method: Callable[..., Any], neutral: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def reported(self: Any, *args: Any) -> Any:
        try:
            return method(self, *args)
        except OneLineError as err:
            context = _host_call_context()
            if context is None:
                raise
            import grpc

            context.set_code(grpc.StatusCode.UNKNOWN)
            context.set_details(str(err))
            return neutral(*args)

    return reported


class Provider(ResourceProvider):
    """A dynamic provider whose ``OneLineError``s reach the user as their one line, not as the
    host's traceback: each lifecycle method a subclass defines is wrapped once, here."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, neutral in _NEUTRAL.items():
            if name in vars(cls):
                setattr(cls, name, _reporting(vars(cls)[name], neutral))
