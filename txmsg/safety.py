"""Exception safety: listener code never decides a transaction by accident.

In the real C++ client an exception escaping a ctypes callback leaves the return value
unwritten, which the native side can read as COMMIT (facts §3 (b)).  So every call into user
code that answers a transaction goes through these functions: an exception, or a return value
that is not a :class:`LocalTransactionState`, becomes a safe state, is logged with the group and
the transaction key on the ``txmsg.transaction`` logger, and never propagates.

An ``async def`` method runs on the app's event loop through a
:class:`~txmsg.aio.loop.LoopBridge` (the calling thread waits for it); a plain method that
*returns* a coroutine is an error (:mod:`txmsg.aio.callables`), answered like any invalid value.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import TYPE_CHECKING, Any, Protocol

from txmsg.aio.callables import discard_awaitable, is_async, name_of, not_awaited_text
from txmsg.errors import LifecycleError
from txmsg.message import Message
from txmsg.otel.hooks import record_exception
from txmsg.states import LocalTransactionState

if TYPE_CHECKING:
    from txmsg.aio.loop import LoopBridge

log = logging.getLogger("txmsg.transaction")


class SpecLike(Protocol):
    """The parts of a listener spec the safety functions need."""

    @property
    def group(self) -> str: ...

    @property
    def on_exception(self) -> LocalTransactionState: ...


def _key(message: Message) -> str | None:
    try:
        return message.transaction_key
    except Exception:  # noqa: BLE001 - a broken message must not break the answer
        return None


def _checked(
    value: object, phase: str, spec: SpecLike, message: Message, fallback: LocalTransactionState
) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    if discard_awaitable(value):
        log.error(
            "group=%s key=%s topic=%s: %s; answering %s",
            spec.group,
            _key(message),
            getattr(message, "topic", None),
            not_awaited_text(phase, value),
            fallback.name,
        )
        return fallback
    log.error(
        "group=%s key=%s topic=%s: %s returned %r, not a LocalTransactionState; answering %s. "
        "Return LocalTransactionState.COMMIT, ROLLBACK or UNKNOW.",
        spec.group,
        _key(message),
        getattr(message, "topic", None),
        phase,
        value,
        fallback.name,
    )
    return fallback


def call_listener(
    method: Any, args: tuple[Any, ...], bridge: LoopBridge | None, phase: str
) -> object:
    """``method(*args)``; an ``async def`` one on ``bridge``'s loop, waited for here.

    Raises:
        LifecycleError: an ``async def`` method and no event loop to run it on.
    """
    if not is_async(method):
        return method(*args)
    if bridge is None:
        raise LifecycleError(
            f"{phase} ({name_of(method)}) is `async def` but no event loop was given to run it "
            "on; start the app (`with app:` or `async with app:`), which provides one"
        )
    return bridge.run(method, *args, name=name_of(method))


def run_execute_local(
    listener: Any,
    message: Message,
    arg: object,
    spec: SpecLike,
    bridge: LoopBridge | None = None,
) -> LocalTransactionState:
    """Call ``listener.execute_local(message, arg)``; never raises.

    An exception or an invalid return answers ``spec.on_exception`` (UNKNOW by default,
    ROLLBACK when configured).  ``bridge``: the loop an ``async def execute_local`` runs on.
    """
    fallback = spec.on_exception
    try:
        value = call_listener(listener.execute_local, (message, arg), bridge, "execute_local")
    except _CANCELLED:
        return _execute_local_cancelled(spec, message)
    except BaseException as exc:  # noqa: BLE001 - logged and recorded there
        return _execute_local_raised(exc, spec, message)
    return _checked(value, "execute_local", spec, message, fallback)


_CANCELLED = (concurrent.futures.CancelledError, asyncio.CancelledError)
"""What a thread waiting for an ``async def execute_local`` gets when the app's close cancels it
(its drain timed out), or the loop shut down under it."""


def _execute_local_cancelled(spec: SpecLike, message: Message) -> LocalTransactionState:
    """UNKNOW for an ``execute_local`` cancelled before it returned, whatever ``on_exception``
    says: it may have committed an instant before, so ROLLBACK could lose a message the database
    kept.  The check-back decides, as on the awaited path (``_transact_on_loop``)."""
    log.warning(
        "group=%s key=%s topic=%s: execute_local was cancelled before it returned (the app "
        "closed while it ran, past the close timeout); whether the local transaction committed "
        "is unknown, so answering UNKNOW: the broker's check-back asks check_local. Give "
        "close()/aclose() a longer timeout or make execute_local return sooner",
        spec.group,
        _key(message),
        getattr(message, "topic", None),
    )
    return LocalTransactionState.UNKNOW


def _execute_local_raised(
    exc: BaseException, spec: SpecLike, message: Message
) -> LocalTransactionState:
    """Log ``execute_local``'s exception, record it on the send's span; the fallback answer."""
    fallback = spec.on_exception
    log.error(
        "group=%s key=%s topic=%s: execute_local raised %s: %s; answering %s",
        spec.group,
        _key(message),
        getattr(message, "topic", None),
        type(exc).__name__,
        exc,
        fallback.name,
        exc_info=True,
    )
    record_exception(exc)  # on the `send <topic>` span it runs in
    return fallback


async def run_execute_local_async(
    listener: Any,
    message: Message,
    arg: object,
    spec: SpecLike,
    bridge: LoopBridge | None = None,
) -> LocalTransactionState:
    """Await an ``async def execute_local(message, arg)`` on the running loop; never raises but
    :class:`asyncio.CancelledError` (the caller then leaves the transaction to the check-back).

    What :func:`run_execute_local` does for a send awaited on the loop itself (a
    :class:`txmsg.backend.SplitTransactionalSender`): no thread waits for the coroutine, so it is
    not submitted through ``bridge``; ``bridge`` only times its steps (slow-step warnings)."""
    method = listener.execute_local
    try:
        coroutine = method(message, arg)
        value = await (bridge.watched(coroutine, name_of(method)) if bridge else coroutine)
    except Exception as exc:  # noqa: BLE001 - logged and recorded there
        return _execute_local_raised(exc, spec, message)
    return _checked(value, "execute_local", spec, message, spec.on_exception)


def run_check_local(
    listener: Any, message: Message, spec: SpecLike, bridge: LoopBridge | None = None
) -> LocalTransactionState:
    """Call ``listener.check_local(message)``; never raises.  Failures answer UNKNOW, so the
    broker asks again later instead of acting on a guess.  ``bridge``: the loop an
    ``async def check_local`` runs on."""
    fallback = LocalTransactionState.UNKNOW
    try:
        value = call_listener(listener.check_local, (message,), bridge, "check_local")
    except BaseException as exc:
        log.error(
            "group=%s key=%s topic=%s: check_local raised %s: %s; answering UNKNOW",
            spec.group,
            _key(message),
            getattr(message, "topic", None),
            type(exc).__name__,
            exc,
            exc_info=True,
        )
        record_exception(exc)  # on the `check <topic>` span it runs in
        return fallback
    return _checked(value, "check_local", spec, message, fallback)
