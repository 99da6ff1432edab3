"""Idempotent ``async def`` consumers: effects and dedup row in one ``AsyncSession`` transaction.

The async twin of :mod:`txmsg.sqla.idempotent`, with the same table, the same rules and the same
SQL: the dedup insert (:func:`~txmsg.sqla.idempotent.record_consumed`) and the duplicate counter
(:func:`~txmsg.sqla.idempotent.count_duplicate`) are the sync layer's, awaited through
``AsyncSession.run_sync``.  A second delivery fails on the insert before the listener runs
(acknowledged, counted as a duplicate); an exception rolls everything back and the broker
redelivers later.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from txmsg.message import Message
from txmsg.sqla.idempotent import (
    DuplicateMessage,
    IdempotentHandler,
    count_duplicate,
    record_consumed,
)

AsyncHandler = Callable[[Message, AsyncSession], Awaitable[object]]


class AsyncIdempotentConsumer(IdempotentHandler):
    """``await consumer(message)`` applies ``fn(message, session)`` once per message key.

    Made by ``@message_listener(..., idempotent=True, session_factory=async_sessionmaker(...))``
    for an ``async def`` listener; counters as :class:`txmsg.sqla.IdempotentConsumer`'s.
    """

    fn: AsyncHandler
    session_factory: Callable[[], AsyncSession]

    def __init__(
        self,
        fn: AsyncHandler,
        session_factory: Callable[[], AsyncSession],
        group: str,
        topic: str,
    ) -> None:
        super().__init__(fn, session_factory, group, topic)

    async def __call__(self, message: Message) -> None:
        await self.apply(message)

    async def apply(
        self,
        message: Message,
        *,
        in_same_transaction: Callable[[Session], object] | None = None,
    ) -> bool:
        """Apply ``message`` once: True = applied now, False = a duplicate.

        ``in_same_transaction(session)`` (a plain function of a sync ``Session``, run through
        ``AsyncSession.run_sync``) runs after ``fn`` in the same database transaction, only when
        the message is applied."""
        key = self.key(message)
        try:
            async with self.session_factory() as session, session.begin():
                await session.run_sync(record_consumed, self.group, message, key, self.topic)
                await self.fn(message, session)
                if in_same_transaction is not None:
                    await session.run_sync(in_same_transaction)
        except DuplicateMessage:
            topic = self._absorbed(message, key)
            try:
                async with self.session_factory() as session:
                    await session.run_sync(count_duplicate, self.group, topic)
            except Exception:  # noqa: BLE001 - logged with its traceback
                self._not_counted(key)
            return False
        self._applied()
        return True
