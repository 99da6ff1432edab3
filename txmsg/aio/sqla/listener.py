"""``AsyncRecordBackedListener``: the record-backed listener for ``AsyncSession`` services.

::

    @app.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder(AsyncRecordBackedListener):
        async def execute_in_transaction(self, session, message, arg):
            (await session.get(Order, arg)).status = "PAID"

The async twin of :class:`txmsg.sqla.RecordBackedListener`, with the same records and rules:
``execute_local`` writes the IN_FLIGHT marker (its own short transaction), awaits the business
change and marks the record COMMITTED in the *same* database transaction, and answers from the
outcome; ``check_local`` answers from the record.

The record statements are the sync layer's own (:mod:`txmsg.sqla.records`,
:class:`txmsg.sqla.check.RecordCheck`), run on one of the async engine's connections through
``AsyncConnection.run_sync`` (:func:`run_on_connection`): one SQL for both layers, so they cannot
drift apart.  Only the business change, which the user writes with an ``AsyncSession``, is new.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from txmsg.errors import ListenerDefinitionError, TransactionFencedError
from txmsg.listener import bound_spec
from txmsg.message import Message
from txmsg.sqla.check import RecordCheck
from txmsg.sqla.engine import SessionFactory
from txmsg.sqla.local import (
    _ANSWER_FOR_RECORD,
    SqlAlchemyLocalTransaction,
    listener_group,
)
from txmsg.sqla.records import begin_in_flight, mark_committed
from txmsg.states import LocalTransactionState

log = logging.getLogger("txmsg.transaction")

T = TypeVar("T")


def engine_of(session_factory: async_sessionmaker[AsyncSession]) -> AsyncEngine:
    """The ``AsyncEngine`` an ``async_sessionmaker`` is bound to.

    Raises:
        ListenerDefinitionError: it is bound to none (``async_sessionmaker(engine)`` is needed).
    """
    bind = session_factory.kw.get("bind")
    if not isinstance(bind, AsyncEngine):
        raise ListenerDefinitionError(
            f"{session_factory!r} is not bound to an AsyncEngine; create it with "
            "txmsg.aio.sqla.make_async_session_factory(engine) or async_sessionmaker(engine)"
        )
    return bind


async def run_on_connection(engine: AsyncEngine, fn: Callable[[SessionFactory], T]) -> T:
    """``fn(session_factory)`` with sync sessions on one connection of ``engine``: how the
    sync record functions run, unchanged, for the async listener.  Each ``with
    session_factory() as s, s.begin():`` in ``fn`` is one transaction of that connection."""
    async with engine.connect() as connection:
        return await connection.run_sync(
            lambda sync_connection: fn(sessionmaker(bind=sync_connection, expire_on_commit=False))
        )


class _RequestedRollback(Exception):
    """Raised inside the session block to roll back when the business change returned
    ROLLBACK."""


class AsyncRecordBackedListener:
    """Base class for record-backed transactional listeners written with ``AsyncSession``.

    Class attributes are the defaults; the constructor overrides them per instance.  As for the
    sync base class, an exception in the business change rolls the database transaction back and
    answers ROLLBACK (txmsg *knows* it did not happen); ``execute_exception_state=UNKNOW`` on
    the decorator overrides it.
    """

    grace_period: float | timedelta = 10.0
    in_flight_timeout: float | timedelta | None = 600.0
    in_flight_marker: bool = True

    def __init__(
        self,
        session_factory: async_sessionmaker[AsyncSession],
        *,
        group: str | None = None,
        grace_period: float | timedelta | None = None,
        in_flight_timeout: float | timedelta | None = None,
    ) -> None:
        self.session_factory = session_factory
        self.engine = engine_of(session_factory)
        if group is not None:
            self.producer_group = group
        if grace_period is not None:
            self.grace_period = grace_period
        if in_flight_timeout is not None:
            self.in_flight_timeout = in_flight_timeout

    # -- what subclasses write ------------------------------------------------------------------
    async def execute_in_transaction(
        self, session: AsyncSession, message: Message, arg: Any
    ) -> object:
        """The business change, inside the open transaction.  Raise (or return ROLLBACK) to roll
        back; return None to commit."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement "
            "async def execute_in_transaction(session, message, arg)"
        )

    # -- the listener protocol ------------------------------------------------------------------
    async def execute_local(self, message: Message, arg: Any) -> LocalTransactionState:
        """The IN_FLIGHT marker, then the business change and the COMMITTED record in one
        transaction (module docstring); never raises."""
        key, group = message.transaction_key, self.group
        if not key:
            log.error(
                "group=%s topic=%s: message has no UNIQ_KEY/transaction key, so no record can "
                "answer a check-back; rolling back without running the local transaction",
                group,
                message.topic,
            )
            return LocalTransactionState.ROLLBACK
        if self.in_flight_marker:
            try:
                existing = await run_on_connection(
                    self.engine,
                    lambda f: begin_in_flight(
                        f, key, group=group, topic=message.topic, keys=message.keys
                    ),
                )
            except Exception:
                log.exception(
                    "group=%s key=%s: could not write the in-flight record; not running the "
                    "local transaction",
                    group,
                    key,
                )
                return self.execute_exception_state
            if existing is not None:
                answer = _ANSWER_FOR_RECORD[existing.state]
                log.warning(
                    "group=%s key=%s: a record already exists (%s); not running the local "
                    "transaction again, answering %s",
                    group,
                    key,
                    existing.state.value,
                    answer.name,
                )
                return answer
        marker = self.in_flight_marker

        def committed(session: Session) -> None:
            mark_committed(
                session,
                key,
                group=group,
                topic=message.topic,
                keys=message.keys,
                in_flight_marker=marker,
            )

        try:
            async with self.session_factory() as session, session.begin():
                result = await self.execute_in_transaction(session, message, arg)
                if LocalTransactionState.coerce(result) is LocalTransactionState.ROLLBACK:
                    raise _RequestedRollback()
                await session.run_sync(committed)
            return LocalTransactionState.COMMIT
        except _RequestedRollback:
            return await self._after_failure(message, key, LocalTransactionState.ROLLBACK, None)
        except TransactionFencedError as exc:
            log.warning("group=%s key=%s: %s", group, key, exc)
            return await self._after_failure(message, key, LocalTransactionState.ROLLBACK, None)
        except Exception as exc:  # noqa: BLE001 - any business failure rolls back; logged there
            return await self._after_failure(message, key, self.execute_exception_state, exc)

    async def check_local(self, message: Message) -> LocalTransactionState:
        """Answer from the record (:class:`txmsg.sqla.check.RecordCheck`'s rules)."""
        group, grace, timeout = self.group, self.grace_period, self.in_flight_timeout
        return await run_on_connection(
            self.engine,
            lambda f: RecordCheck(f, group=group, grace_period=grace, in_flight_timeout=timeout)(
                message
            ),
        )

    async def _after_failure(
        self,
        message: Message,
        key: str,
        wanted: LocalTransactionState,
        exc: BaseException | None,
    ) -> LocalTransactionState:
        """Settle the record ROLLED_BACK and answer from it (the sync layer's rule: a commit
        that reported an error but left a COMMITTED record answers COMMIT)."""
        group, on_error = self.group, self.execute_exception_state

        def settle(factory: SessionFactory) -> LocalTransactionState:
            local = SqlAlchemyLocalTransaction(factory, group=group, on_error=on_error)
            return local._after_failure(message, key, wanted, exc)

        return await run_on_connection(self.engine, settle)

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def group(self) -> str:
        """The producer group this instance answers for (as ``RecordBackedListener.group``)."""
        return listener_group(self)

    @property
    def execute_exception_state(self) -> LocalTransactionState:
        """ROLLBACK (the database transaction was rolled back), unless the app's declaration
        said otherwise with ``execute_exception_state=``."""
        spec = bound_spec(self)
        chosen = spec.execute_exception_state if spec is not None else None
        return chosen or LocalTransactionState.ROLLBACK
