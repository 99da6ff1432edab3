"""Check-backs: from a backend's native thread to the listener's executor and back.

The C++ client delivers all check-backs of one client instance on one native thread, and the
broker re-sends a check for a transaction that is still unresolved.  The dispatcher therefore
(1) runs ``check_local`` on the listener's :class:`~txmsg.executor.TxExecutor` (so checks of one
group can run in parallel across the backend's threads), (2) runs a check for a transaction key
at most once at a time: a repeated check of the same key waits for the running one and returns
its answer, and (3) never raises into the backend.

The dispatcher answers UNKNOW without an answer from ``check_local`` in exactly these cases (UNKNOW
means "no answer yet": the broker asks again at its next check interval):

a. ``check_local`` raised or returned something that is not a ``LocalTransactionState``;
b. it outlived ``wait_timeout`` (``check_wait_timeout`` in the config); it keeps running and the
   broker's next check of that transaction joins it;
c. the executor refused the check: ``rejection='abort'`` and every thread busy with a full
   queue (only possible when async sends fill the pool; see :mod:`txmsg.executor`);
d. the executor is shut down (the application is closing).

(b), (c) and (d) log a WARNING on ``txmsg.transaction``; (a) logs an ERROR.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from txmsg.defaults import CHECK_WAIT_TIMEOUT
from txmsg.errors import RejectedError
from txmsg.executor import TxExecutor
from txmsg.listener import ListenerSpec
from txmsg.message import Message
from txmsg.safety import run_check_local
from txmsg.states import LocalTransactionState

log = logging.getLogger("txmsg.transaction")

UNKNOW = LocalTransactionState.UNKNOW


@dataclass(frozen=True)
class DispatchStats:
    """Counters of one dispatcher."""

    checks: int
    """Check-backs received."""
    deduplicated: int
    """Check-backs answered by joining a running check of the same transaction key."""
    rejected: int
    """Check-backs the executor refused (``rejection='abort'`` with a full pool, or shut down):
    answered UNKNOW.  Under ``caller_runs`` a full pool runs the check on the native thread
    instead (counted in the executor's ``caller_ran``)."""
    timed_out: int
    """Check-backs answered UNKNOW because check_local took longer than ``wait_timeout``."""
    in_flight: int
    """Transaction keys being checked right now."""


class CheckDispatcher:
    """Turns a backend's check-back into one ``check_local`` call on the listener's executor.

    Parameters:
        listener: the listener instance (has ``check_local(message)``).
        spec: its :class:`~txmsg.listener.ListenerSpec` (group, for logs).
        executor: the listener's executor; :meth:`~txmsg.executor.TxExecutor.submit` applies
            its rejection policy.
        wait_timeout: seconds a native thread waits for an answer before replying UNKNOW
            (the check keeps running; the broker will ask again and join it).
    """

    def __init__(
        self,
        listener: Any,
        spec: ListenerSpec,
        executor: TxExecutor,
        *,
        wait_timeout: float = CHECK_WAIT_TIMEOUT,
    ) -> None:
        self.listener = listener
        self.spec = spec
        self.executor = executor
        self.wait_timeout = wait_timeout
        self._lock = threading.RLock()  # RLock: done-callbacks may run inline under it
        self._in_flight: dict[str, Future[LocalTransactionState]] = {}
        self._checks = 0
        self._deduplicated = 0
        self._rejected = 0
        self._timed_out = 0

    @property
    def check_concurrency(self) -> int:
        """How many checks this group can run at once: what the backend should provision."""
        return self.executor.config.concurrency

    def handle(self, message: Message) -> LocalTransactionState:
        """Answer one check-back; called on the backend's threads; never raises."""
        try:
            return self._handle(message)
        except BaseException as exc:
            log.error(
                "group=%s key=%s: check dispatch failed: %s: %s; answering UNKNOW",
                self.spec.group,
                _key(message),
                type(exc).__name__,
                exc,
                exc_info=True,
            )
            return UNKNOW

    __call__ = handle

    def _handle(self, message: Message) -> LocalTransactionState:
        key = _key(message)
        answer: Future[LocalTransactionState] = Future()
        with self._lock:
            self._checks += 1
            running = self._in_flight.get(key) if key else None
            if running is not None:
                self._deduplicated += 1
            elif key:
                self._track(key, answer)  # before submit: caller_runs may run it right here
        if running is not None:
            log.debug("group=%s key=%s: check already running; joining it", self.spec.group, key)
            return self._wait(running, key)
        try:
            submitted = self.executor.submit(run_check_local, self.listener, message, self.spec)
        except RejectedError as exc:
            with self._lock:
                self._rejected += 1
            log.warning(
                "group=%s key=%s: check-back not run: %s; answering UNKNOW so the broker checks "
                "again later",
                self.spec.group,
                key,
                exc,
            )
            answer.set_result(UNKNOW)  # joiners too
            return UNKNOW
        except BaseException:
            answer.set_result(UNKNOW)  # never leave joiners (and the key) hanging
            raise
        submitted.add_done_callback(lambda done: answer.set_result(_state_of(done)))
        return self._wait(answer, key)

    def _track(self, key: str, future: Future[LocalTransactionState]) -> None:
        self._in_flight[key] = future

        def forget(done: Future[LocalTransactionState]) -> None:
            with self._lock:
                if self._in_flight.get(key) is done:
                    del self._in_flight[key]

        future.add_done_callback(forget)

    def _wait(self, future: Future[LocalTransactionState], key: str | None) -> LocalTransactionState:
        try:
            state = future.result(timeout=self.wait_timeout)
        except FutureTimeout:
            with self._lock:
                self._timed_out += 1
            log.warning(
                "group=%s key=%s: check_local still running after %ss; answering UNKNOW "
                "(the broker will check again)",
                self.spec.group,
                key,
                self.wait_timeout,
            )
            return UNKNOW
        return state if isinstance(state, LocalTransactionState) else UNKNOW

    def stats(self) -> DispatchStats:
        """A snapshot of the counters."""
        with self._lock:
            return DispatchStats(
                checks=self._checks,
                deduplicated=self._deduplicated,
                rejected=self._rejected,
                timed_out=self._timed_out,
                in_flight=len(self._in_flight),
            )


def _state_of(done: Future[Any]) -> LocalTransactionState:
    """A finished check's answer; UNKNOW if it was cancelled (shutdown) or failed."""
    if done.cancelled() or done.exception() is not None:
        return UNKNOW  # run_check_local never raises; keep joiners safe anyway
    state = done.result()
    return state if isinstance(state, LocalTransactionState) else UNKNOW


def _key(message: Message) -> str | None:
    try:
        return message.transaction_key
    except Exception:  # noqa: BLE001
        return None
