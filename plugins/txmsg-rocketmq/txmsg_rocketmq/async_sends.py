"""The asynchronous sends of one plain producer that wait for librocketmq's callbacks.

``SendAsync``'s callbacks carry user data, so one pair of ctypes thunks (made here, kept as long as
the producer) serves every unordered send: the send's id is the user data.  The ordered asynchronous
call has none, so each ordered send gets a thunk pair of its own, freed a while after it ran.  Both
callbacks end here: the pending entry's future completes, once, and nothing crosses back into C.
Kept apart from :mod:`.sender`, which decides *what* to send; this module only matches answers to
the futures that wait for them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from txmsg.message import SendResult

from ._errors import SendError
from .native import (
    ON_SEND_EXCEPTION,
    ON_SEND_SUCCESS,
    SEND_EXCEPTION,
    SEND_STATUS_NAMES,
    SEND_SUCCESS,
    CMQException,
    CSendResult,
)

if TYPE_CHECKING:
    from .sender import PlainSender

log = logging.getLogger("txmsg.rocketmq")

_SPENT_THUNK_TTL = 5.0
"""Seconds a per-send thunk pair is kept after its callback ran (see PendingSends.complete)."""


def status_name(code: int) -> str:
    """The name of a librocketmq send status (its number when unknown)."""
    return SEND_STATUS_NAMES.get(int(code), str(int(code)))


def c_text(raw: bytes) -> str:
    """A C string of librocketmq as text (undecodable bytes replaced, never an error)."""
    return raw.decode("utf-8", "replace")


class OrderlyThunks:
    """Thunks of one ordered asynchronous send (``SendMessageOrderlyAsync`` has no user data)."""

    __slots__ = ("on_error", "on_success")

    def __init__(self, on_success: Any, on_error: Any) -> None:
        self.on_success = on_success
        self.on_error = on_error


class PendingSends:
    """Asynchronous sends of ``sender`` still waiting for the broker: id -> (future, the send's
    own thunks if ordered, the queue the selector chose)."""

    def __init__(self, sender: PlainSender) -> None:
        self.sender = sender
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[Future[SendResult], OrderlyThunks | None, int | None]] = {}
        self._lock = threading.Lock()
        self._spent: deque[tuple[float, OrderlyThunks]] = deque()
        # One thunk each for the whole life of the producer (it must outlive the native client).
        self.on_success = ON_SEND_SUCCESS(self._success)
        self.on_exception = ON_SEND_EXCEPTION(self._exception)

    def next_id(self) -> int:
        """The id of the next send: the user data of its callbacks."""
        return next(self._ids)

    def add(self, send_id: int, future: Future[SendResult], thunks: OrderlyThunks | None) -> None:
        """Register send ``send_id`` before it goes out (its answer may come before the call
        returns)."""
        with self._lock:
            self._pending[send_id] = (future, thunks, None)

    def chose_queue(self, send_id: int, index: int) -> None:
        """The selector picked queue ``index`` for send ``send_id`` (its answer reports it)."""
        with self._lock:
            entry = self._pending.get(send_id)
            if entry is not None:
                self._pending[send_id] = (entry[0], entry[1], index)

    def ids(self) -> list[int]:
        """The ids of the sends still waiting."""
        with self._lock:
            return list(self._pending)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def ordered_callbacks(self, send_id: int) -> OrderlyThunks:
        """A thunk pair of one ordered send, answering for ``send_id``."""
        return OrderlyThunks(
            SEND_SUCCESS(lambda result: self._success(result, None, send_id)),
            SEND_EXCEPTION(lambda exc: self._exception(exc, None, send_id)),
        )

    def _success(self, result: CSendResult, _message: int | None, send_id: int | None) -> None:
        self._callback(
            send_id,
            lambda queue: SendResult(
                message_id=c_text(result.msgId),
                send_status=status_name(result.sendStatus),
                offset=int(result.offset),
                queue_id=queue,
            ),
        )

    def _exception(self, exc: CMQException, _message: int | None, send_id: int | None) -> None:
        detail = f"{c_text(exc.msg)} (error {int(exc.error)})"
        group = self.sender.group

        def error(_queue: int | None) -> SendError:
            return SendError(
                f"asynchronous send (group {group!r}) failed: {detail}. librocketmq 2.1.0 "
                "reports broker refusals of asynchronous sends without their reason; the broker's "
                "broker.log and the client log (ROCKETMQ_CLIENT_LOG_DIR) name it"
            )

        self._callback(send_id, error)

    def _callback(
        self, send_id: int | None, outcome: Callable[[int | None], SendResult | SendError]
    ) -> None:
        """Body of both native callbacks: never lets an exception into C."""
        gate = self.sender.gate
        gate.enter_callback(refuse_after_shut=False)
        try:
            with self._lock:
                entry = self._pending.get(int(send_id or 0))
            queue = entry[2] if entry is not None else None
            value = outcome(queue)
            if isinstance(value, SendResult):
                self.complete(int(send_id or 0), result=value)
            else:
                self.complete(int(send_id or 0), error=value)
        except BaseException:
            with contextlib.suppress(
                BaseException
            ):  # a logging failure cannot be reported anywhere
                log.exception("asynchronous send callback of %s failed", self.sender.group)
        finally:
            gate.exit_callback()

    def complete(
        self, send_id: int, *, result: SendResult | None = None, error: BaseException | None = None
    ) -> None:
        """End send ``send_id`` with its result or error; a second answer for it is ignored."""
        with self._lock:
            entry = self._pending.pop(send_id, None)
            if entry is not None and entry[1] is not None:
                # Per-send thunks: we may be running inside one right now, and ctypes reads the
                # thunk's cif after the Python body returns - free them a while later instead.
                now = time.monotonic()
                self._spent.append((now, entry[1]))
                while self._spent and now - self._spent[0][0] > _SPENT_THUNK_TTL:
                    self._spent.popleft()
        if entry is None:
            return  # already completed (failure reported twice) or failed by close()
        future = entry[0]
        sender = self.sender
        sender.gate.exit_send()
        if error is not None:
            sender.failed += 1
            future.set_exception(error)
        elif result is not None:
            sender.sent += 1
            future.set_result(result)
