"""Turning Python answers into the ints librocketmq expects, without ever raising into ctypes.

Why: when a ctypes callback raises, ctypes prints "Exception ignored on calling ctypes callback
function" and never writes the return value; on x86-64 the C caller then reads whatever is in
the register (observed: 0 = COMMIT on the first call).  An escaping exception can therefore
commit a transaction.  Every callback body in this plugin is wrapped by :func:`guarded`, which
catches ``BaseException`` (``SystemExit`` from user code included) and returns an explicit int.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from txmsg.states import LocalTransactionState

from .native import E_UNKNOWN_TRANSACTION

log = logging.getLogger("txmsg.rocketmq")


def state_code(state: object, *, what: str, key: str | None) -> int:
    """The C API code for ``state``; anything that is not a valid state becomes UNKNOW (2)."""
    coerced = LocalTransactionState.coerce(state)
    if coerced is None:
        _safe_log(
            logging.WARNING,
            "%s returned %r for transaction %s; answering UNKNOW (return a LocalTransactionState)",
            what,
            state,
            key,
        )
        return E_UNKNOWN_TRANSACTION
    return int(coerced.value)


def guarded(fallback: int, what: str, body: Callable[..., int]) -> Callable[..., int]:
    """Wrap ``body`` so it always returns an int and never lets an exception out."""

    def callback(*args: Any) -> int:
        try:
            result = body(*args)
            return result if type(result) is int else fallback
        except BaseException:  # noqa: BLE001 - nothing may cross into C
            _safe_log(logging.ERROR, "%s raised; answering %d", what, fallback, exc_info=True)
            return fallback

    return callback


def _safe_log(level: int, msg: str, *args: object, exc_info: bool = False) -> None:
    """Log from a native thread; a broken handler must not turn into an escaping exception."""
    with contextlib.suppress(BaseException):  # a logging failure cannot be reported anywhere
        log.log(level, msg, *args, exc_info=exc_info)
