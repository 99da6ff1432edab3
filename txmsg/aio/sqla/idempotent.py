"""Idempotent ``async def`` consumers: effects and dedup row in one ``AsyncSession`` transaction.

The async twin of :mod:`txmsg.sqla.idempotent`, with the same table and the same rules: the
insert of ``(consumer group, message key)`` fails on a second delivery before the listener runs
(acknowledged, counted as a duplicate); an exception rolls everything back and the broker
redelivers later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from txmsg.errors import InvalidMessageError, ListenerDefinitionError, TxMsgError
from txmsg.message import Message
from txmsg.sqla.idempotent import DuplicateMessage, message_key
from txmsg.sqla.models import ConsumedMessage, ConsumeStat, utcnow

log = logging.getLogger("txmsg.idempotent")

AsyncHandler = Callable[[Message, AsyncSession], Awaitable[object]]


class AsyncIdempotentConsumer:
    """``await consumer(message)`` applies ``fn(message, session)`` once per message key.

    Made by ``@message_listener(..., idempotent=True, session_factory=async_sessionmaker(...))``
    for an ``async def`` listener; counters as :class:`txmsg.sqla.IdempotentConsumer`'s.
    """

    def __init__(
        self,
        fn: AsyncHandler,
        session_factory: Callable[[], AsyncSession],
        group: str,
        topic: str,
    ) -> None:
        if not group:
            raise ListenerDefinitionError(
                "an idempotent consumer needs its consumer group: pass group=... (the one of "
                "@message_listener)"
            )
        self.fn = fn
        self.session_factory = session_factory
        self.group = group
        self.topic = topic
        self._lock = threading.Lock()  # counters: the loop's thread and readers elsewhere
        self.applied = 0
        self.duplicates = 0
        self.__name__ = getattr(fn, "__name__", "idempotent_consumer")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

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
        key = message_key(message)
        if not key:
            raise InvalidMessageError(
                f"group={self.group}: message without UNIQ_KEY or message id cannot be "
                "de-duplicated; send it with the txmsg producer or the RocketMQ client"
            )
        try:
            async with self.session_factory() as session, session.begin():
                try:
                    async with session.begin_nested():
                        await session.execute(
                            insert(ConsumedMessage).values(
                                consumer_group=self.group,
                                message_key=key,
                                topic=message.topic or self.topic,
                                message_id=message.message_id,
                                consumed_at=utcnow(),
                            )
                        )
                except IntegrityError as exc:
                    raise DuplicateMessage(key) from exc
                await self.fn(message, session)
                if in_same_transaction is not None:
                    await session.run_sync(in_same_transaction)
        except DuplicateMessage:
            await self._absorb(message, key)
            return False
        with self._lock:
            self.applied += 1
        return True

    async def _absorb(self, message: Message, key: str) -> None:
        with self._lock:
            self.duplicates += 1
        topic = message.topic or self.topic
        log.info(
            "group=%s topic=%s key=%s msgId=%s reconsume=%d: duplicate delivery absorbed "
            "(already applied)",
            self.group,
            topic,
            key,
            message.message_id,
            message.reconsume_times,
        )
        try:
            await _count_duplicate(self.session_factory, self.group, topic)
        except Exception:
            log.exception("group=%s key=%s: could not count the duplicate", self.group, key)


async def _count_duplicate(
    session_factory: Callable[[], AsyncSession], group: str, topic: str
) -> None:
    for _ in range(3):
        now = utcnow()
        async with session_factory() as session, session.begin():
            result: Any = await session.execute(
                update(ConsumeStat)
                .where(ConsumeStat.consumer_group == group, ConsumeStat.topic == topic)
                .values(duplicates=ConsumeStat.duplicates + 1, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            if getattr(result, "rowcount", 0) == 1:
                return
        try:
            async with session_factory() as session, session.begin():
                await session.execute(
                    insert(ConsumeStat).values(
                        consumer_group=group, topic=topic, duplicates=1, updated_at=now
                    )
                )
            return
        except IntegrityError:
            continue  # created concurrently: update it instead
    raise TxMsgError(
        f"could not update the duplicate counter of {group}/{topic} after 3 attempts; check "
        "that the txmsg tables exist (txmsg.sqla.create_tables) and the database is writable"
    )
