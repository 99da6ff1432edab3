"""Run a local transaction in one SQLAlchemy transaction together with its transaction record.

:class:`SqlAlchemyLocalTransaction` is the engine room: ``execute(message, work)`` writes the
IN_FLIGHT marker (own short transaction), runs ``work(session)`` and marks the record COMMITTED in
the *same* database transaction as the business change, then answers:

* commit -> COMMIT (the record exists exactly when the business change does);
* exception, or ``work`` returned ROLLBACK -> the database transaction is rolled back, the record
  becomes ROLLED_BACK (never COMMITTED) and the answer is ``on_error`` (ROLLBACK by default; with
  UNKNOW the broker asks again and the record answers ROLLBACK);
* with ``answer_within`` set, a local transaction that takes longer is answered UNKNOW and keeps
  running; the broker's check-back then reads the outcome from the record (see
  :class:`txmsg.sqla.check.RecordCheck`).

:func:`transactional` is the Spring-``@Transactional``-style decorator for an ``execute_local``
method that takes the session as a fourth argument.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from sqlalchemy.orm import Session

from txmsg.errors import ConfigError, ListenerDefinitionError, TransactionFencedError
from txmsg.listener import bound_spec
from txmsg.message import Message
from txmsg.sqla.engine import SessionFactory
from txmsg.sqla.models import RecordState
from txmsg.sqla.records import (
    begin_in_flight,
    mark_committed,
    settle_rolled_back,
)
from txmsg.states import LocalTransactionState

log = logging.getLogger("txmsg.transaction")

Work = Callable[[Session], object]
"""The business change: gets the session of the open transaction; returns None (commit),
LocalTransactionState.ROLLBACK (roll back without an exception) or anything else (commit)."""

_ANSWER_FOR_RECORD = {
    RecordState.COMMITTED: LocalTransactionState.COMMIT,
    RecordState.ROLLED_BACK: LocalTransactionState.ROLLBACK,
    RecordState.IN_FLIGHT: LocalTransactionState.UNKNOW,
}


class RequestedRollback(Exception):
    """Raised inside the session block to roll back when the business change returned
    ROLLBACK (:func:`roll_back_if_asked`)."""


# ---- the steps of a local transaction, shared by the sync and the asyncio listeners ---------------
# Each takes a sync session (factory); the asyncio listener awaits the very same functions through
# run_sync (txmsg.aio.sqla.listener), so both write the same records by the same SQL.


def begin_local(
    session_factory: SessionFactory, message: Message, key: str, *, group: str
) -> LocalTransactionState | None:
    """Write the IN_FLIGHT marker; None when written, else the answer from the record that
    exists already (the business change must not run again).  Raises when it cannot be
    written (:func:`marker_failed` answers then)."""
    existing = begin_in_flight(
        session_factory, key, group=group, topic=message.topic, keys=message.keys
    )
    if existing is None:
        return None
    answer = _ANSWER_FOR_RECORD[existing.state]
    log.warning(
        "group=%s key=%s: a record already exists (%s); not running the local transaction "
        "again, answering %s",
        group,
        key,
        existing.state.value,
        answer.name,
    )
    return answer


def marker_failed(group: str, key: str, on_error: LocalTransactionState) -> LocalTransactionState:
    """The answer (``on_error``) when the IN_FLIGHT marker could not be written; logs why."""
    log.exception(
        "group=%s key=%s: could not write the in-flight record; not running the local transaction",
        group,
        key,
    )
    return on_error


def roll_back_if_asked(result: object) -> None:
    """Raise :class:`RequestedRollback` when the business change returned ROLLBACK."""
    if LocalTransactionState.coerce(result) is LocalTransactionState.ROLLBACK:
        raise RequestedRollback()


def commit_record(
    session: Session, message: Message, key: str, *, group: str, in_flight_marker: bool
) -> None:
    """Mark the record COMMITTED in the business change's transaction (fenced: raises
    :class:`TransactionFencedError` when a check gave it up)."""
    mark_committed(
        session,
        key,
        group=group,
        topic=message.topic,
        keys=message.keys,
        in_flight_marker=in_flight_marker,
    )


def failure_answer(
    exc: Exception, *, group: str, key: str, on_error: LocalTransactionState
) -> tuple[LocalTransactionState, Exception | None]:
    """What a failed business transaction wants to answer, and the error to log with it (None
    when nothing failed: a requested rollback, or a fenced commit)."""
    if isinstance(exc, RequestedRollback):
        return LocalTransactionState.ROLLBACK, None
    if isinstance(exc, TransactionFencedError):
        log.warning("group=%s key=%s: %s", group, key, exc)
        return LocalTransactionState.ROLLBACK, None
    return on_error, exc


def settle_failure(
    session_factory: SessionFactory,
    message: Message,
    key: str,
    wanted: LocalTransactionState,
    exc: BaseException | None,
    *,
    group: str,
) -> LocalTransactionState:
    """Settle the record as ROLLED_BACK and answer from what the record then says.

    A failing COMMIT may still have committed (connection lost after the server committed);
    the record tells: COMMITTED means the business change is there, so the answer is COMMIT.
    """
    if exc is not None:
        log.warning(
            "group=%s key=%s: local transaction failed (%s: %s); database rolled back, "
            "answering %s",
            group,
            key,
            type(exc).__name__,
            exc,
            wanted.name,
            exc_info=exc,
        )
    try:
        record = settle_rolled_back(
            session_factory, key, group=group, topic=message.topic, keys=message.keys
        )
    except Exception:
        log.exception(
            "group=%s key=%s: could not mark the record rolled back; answering UNKNOW so a "
            "check-back decides from the record later",
            group,
            key,
        )
        return LocalTransactionState.UNKNOW
    if record.state is RecordState.COMMITTED:
        log.warning(
            "group=%s key=%s: the commit reported an error but the record is COMMITTED; "
            "answering COMMIT",
            group,
            key,
        )
        return LocalTransactionState.COMMIT
    return wanted


class SqlAlchemyLocalTransaction:
    """Bind local transactions of one producer group to a database.

    ``session_factory`` must return sessions on the database holding both the business tables
    and the txmsg tables (:func:`txmsg.sqla.create_tables`).
    """

    def __init__(
        self,
        session_factory: SessionFactory,
        *,
        group: str,
        on_error: LocalTransactionState = LocalTransactionState.ROLLBACK,
        in_flight_marker: bool = True,
        answer_within: float | None = None,
        background_workers: int = 8,
    ) -> None:
        if on_error is LocalTransactionState.COMMIT:
            raise ConfigError(
                "on_error must be ROLLBACK or UNKNOW: a failed transaction never commits"
            )
        if answer_within is not None and answer_within <= 0:
            raise ConfigError("answer_within must be a positive number of seconds (or None)")
        if background_workers <= 0:
            raise ConfigError("background_workers must be a positive number of threads")
        self.session_factory = session_factory
        self.group = group
        self.on_error = on_error
        self.in_flight_marker = in_flight_marker
        self.answer_within = answer_within
        self._background_workers = background_workers
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # -- public -------------------------------------------------------------------------------
    def execute(self, message: Message, work: Work) -> LocalTransactionState:
        """Run ``work`` as the local transaction of ``message``; never raises."""
        key = message.transaction_key
        if not key:
            log.error(
                "group=%s topic=%s: message has no UNIQ_KEY/transaction key, so no record can "
                "answer a check-back; rolling back without running the local transaction",
                self.group,
                message.topic,
            )
            return LocalTransactionState.ROLLBACK
        # The in-flight marker is written here, in the calling thread, even when the business
        # part runs in the background: a check-back must never find "no record" for a
        # transaction that has started.
        early = self._begin(message, key)
        if early is not None:
            return early
        if self.answer_within is None:
            return self._business(message, key, work)
        future = self._background().submit(self._business, message, key, work)
        try:
            return future.result(timeout=self.answer_within)
        except FutureTimeout:
            log.info(
                "group=%s key=%s: local transaction still running after %.3fs; answering UNKNOW, "
                "the check-back will read the outcome from the record",
                self.group,
                key,
                self.answer_within,
            )
            return LocalTransactionState.UNKNOW

    def close(self, wait: bool = True) -> None:
        """Wait for local transactions still running past ``answer_within``."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait)

    # -- internals ----------------------------------------------------------------------------
    def _background(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self._background_workers, thread_name_prefix=f"txmsg-local-{self.group}"
                )
            return self._pool

    def _begin(self, message: Message, key: str) -> LocalTransactionState | None:
        """Write the IN_FLIGHT marker; an answer when the business part must not run."""
        if not self.in_flight_marker:
            return None
        try:
            return begin_local(self.session_factory, message, key, group=self.group)
        except Exception:  # noqa: BLE001 - logged with its traceback
            return marker_failed(self.group, key, self.on_error)

    def _business(self, message: Message, key: str, work: Work) -> LocalTransactionState:
        try:
            with self.session_factory() as session, session.begin():
                roll_back_if_asked(work(session))
                commit_record(
                    session, message, key, group=self.group, in_flight_marker=self.in_flight_marker
                )
            return LocalTransactionState.COMMIT
        except Exception as exc:  # noqa: BLE001 - any business failure rolls back; logged there
            wanted, error = failure_answer(exc, group=self.group, key=key, on_error=self.on_error)
            return settle_failure(
                self.session_factory, message, key, wanted, error, group=self.group
            )


def listener_group(listener: object) -> str:
    """The producer group of a listener instance: from the spec the app that runs it bound to
    it at start (:func:`txmsg.listener.bind_spec`), else a ``producer_group`` attribute.

    Never from the class: one class may be declared by several apps under several groups, and
    each instance must write the records of its own app's group.
    """
    spec = bound_spec(listener)
    group = spec.group if spec is not None else getattr(listener, "producer_group", None)
    if not isinstance(group, str) or not group:
        raise ListenerDefinitionError(
            f"{type(listener).__name__} has no producer group: declare it with "
            "@app.transactional_listener(group=...) and let the app start it, or set a "
            "producer_group attribute"
        )
    return group


def transactional(
    session_factory: SessionFactory | None = None,
    *,
    on_error: LocalTransactionState = LocalTransactionState.ROLLBACK,
    in_flight_marker: bool = True,
    answer_within: float | None = None,
) -> Callable[[Callable[..., object]], Callable[..., LocalTransactionState]]:
    """Make ``execute_local(self, message, arg, session)`` run in one database transaction with
    its transaction record (Spring's ``@Transactional`` for the local transaction).

    The decorated method keeps the ``execute_local(self, message, arg)`` signature the listener
    decorator expects.  ``session_factory`` defaults to the listener's ``session_factory``
    attribute; the producer group comes from the listener's spec.  Pair it with
    :class:`txmsg.sqla.check.RecordCheck` (or :class:`txmsg.sqla.RecordBackedListener`) for the
    default ``check_local``.
    """

    def decorate(fn: Callable[..., object]) -> Callable[..., LocalTransactionState]:
        cache_attr = f"__txmsg_local_tx_{fn.__name__}"

        @functools.wraps(fn)
        def execute_local(self: Any, message: Message, arg: Any = None) -> LocalTransactionState:
            runner: SqlAlchemyLocalTransaction | None = self.__dict__.get(cache_attr)
            if runner is None:
                factory = session_factory or getattr(self, "session_factory", None)
                if factory is None:
                    raise ListenerDefinitionError(
                        f"@transactional on {type(self).__name__}.{fn.__name__} needs a "
                        "session_factory: pass one to the decorator or set self.session_factory"
                    )
                runner = SqlAlchemyLocalTransaction(
                    factory,
                    group=listener_group(self),
                    on_error=on_error,
                    in_flight_marker=in_flight_marker,
                    answer_within=answer_within,
                )
                self.__dict__[cache_attr] = runner
            return runner.execute(message, lambda session: fn(self, message, arg, session))

        params = list(inspect.signature(fn).parameters.values())[:3]
        execute_local.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return execute_local

    return decorate
