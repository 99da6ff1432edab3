"""Telling ``async def`` callables from plain ones, and what to do with a stray coroutine.

txmsg awaits what is *declared* ``async def`` (a coroutine function, a bound ``async def``
method, or an object whose ``__call__`` is one).  A plain ``def`` that returns a coroutine
(one that calls an ``async def`` and forgets ``await``, or a decorator that hides ``async def``)
is a mistake txmsg cannot repair safely: the work in that coroutine never ran.  So the coroutine
is closed (no "never awaited" warning later, far from the cause) and the caller gets
:func:`not_awaited_text`, which names the callable and the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def is_async(fn: Any) -> bool:
    """True when calling ``fn`` returns a coroutine by declaration (``async def``)."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an instance whose __call__ is async
    return (
        call is not None
        and not inspect.isfunction(fn)
        and not inspect.ismethod(fn)
        and inspect.iscoroutinefunction(call)
    )


def name_of(fn: Callable[..., Any] | Any) -> str:
    """``module.qualname`` of a function or bound method, for logs and errors."""
    target = getattr(fn, "__func__", fn)
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


def discard_awaitable(value: object) -> bool:
    """If ``value`` is awaitable, close it when it is a coroutine and return True."""
    if not inspect.isawaitable(value):
        return False
    if inspect.iscoroutine(value):
        value.close()  # never started: closing it is what keeps "never awaited" quiet
    return True


def not_awaited_text(what: str, value: object) -> str:
    """The error for ``what`` (a callable's name) having returned the awaitable ``value``."""
    return (
        f"{what} returned {type(value).__name__} {value!r}, an awaitable nobody awaited, so the "
        "work inside it never ran: declare the method itself `async def` (txmsg awaits it), or "
        "`await` the coroutine inside it, or return a result instead"
    )
