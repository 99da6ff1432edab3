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
from sqlalchemy.orm import sessionmaker

from txmsg.errors import ListenerDefinitionError
from txmsg.message import Message
from txmsg.sqla.check import RecordCheck
from txmsg.sqla.engine import SessionFactory
from txmsg.sqla.listener import RecordBacked
from txmsg.sqla.local import (
    begin_local,
    commit_record,
    failure_answer,
    marker_failed,
    roll_back_if_asked,
    settle_failure,
)
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


class AsyncRecordBackedListener(RecordBacked):
    """Base class for record-backed transactional listeners written with ``AsyncSession``.

    Class attributes are the defaults; the constructor overrides them per instance.  As for the
    sync base class, an exception in the business change rolls the database transaction back and
    answers ROLLBACK (txmsg *knows* it did not happen); ``execute_exception_state=UNKNOW`` on
    the decorator overrides it.
    """

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
        self._settings(group, grace_period, in_flight_timeout)

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
        transaction (module docstring); never raises.  Each step is the sync listener's
        (:mod:`txmsg.sqla.local`), awaited."""
        key, group, on_error = message.transaction_key, self.group, self.execute_exception_state
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
                early = await run_on_connection(
                    self.engine, lambda f: begin_local(f, message, key, group=group)
                )
            except Exception:  # noqa: BLE001 - logged with its traceback
                return marker_failed(group, key, on_error)
            if early is not None:
                return early
        try:
            async with self.session_factory() as session, session.begin():
                roll_back_if_asked(await self.execute_in_transaction(session, message, arg))
                await session.run_sync(
                    commit_record, message, key, group=group, in_flight_marker=self.in_flight_marker
                )
            return LocalTransactionState.COMMIT
        except Exception as exc:  # noqa: BLE001 - any business failure rolls back; logged there
            wanted, error = failure_answer(exc, group=group, key=key, on_error=on_error)
            return await run_on_connection(
                self.engine,
                lambda f: settle_failure(f, message, key, wanted, error, group=group),
            )

    async def check_local(self, message: Message) -> LocalTransactionState:
        """Answer from the record (:class:`txmsg.sqla.check.RecordCheck`'s rules)."""
        group, grace, timeout = self.group, self.grace_period, self.in_flight_timeout
        return await run_on_connection(
            self.engine,
            lambda f: RecordCheck(f, group=group, grace_period=grace, in_flight_timeout=timeout)(
                message
            ),
        )
