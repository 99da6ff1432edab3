"""Idempotent consumers: a message's effects and its dedup row commit together.

RocketMQ delivers at least once; a transactional message can even be delivered twice with the
same ``UNIQ_KEY`` when check-backs back up (``docs/rocketmq-facts.md``).
:func:`wrap_idempotent` turns ``fn(message, session)`` into a consumer that, in ONE database
transaction, inserts ``(consumer group, message key)`` into ``txmsg_consumed_message`` and runs
``fn``.  The primary key makes a second delivery fail on that insert, before ``fn`` runs:

* duplicate -> nothing applied, acknowledged (returns normally), counted in
  ``txmsg_consume_stat`` and in :attr:`IdempotentConsumer.duplicates`, logged at INFO;
* ``fn`` raises -> everything rolled back (dedup row included), the exception propagates so the
  broker redelivers later.

Two deliveries of one message running at the same moment: on PostgreSQL the second insert waits
for the first transaction and then fails (or succeeds, if the first rolled back); on SQLite
writers are serialised.  Either way exactly one applies the effects.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from txmsg.errors import InvalidMessageError, ListenerDefinitionError, TxMsgError
from txmsg.message import DEDUP_KEY, UNIQ_KEY, Message
from txmsg.sqla.engine import SessionFactory, read_only
from txmsg.sqla.models import ConsumedMessage, ConsumeStat, utcnow

log = logging.getLogger("txmsg.idempotent")

Handler = Callable[[Message, Session], object]


def message_key(message: Message) -> str | None:
    """The dedup key: ``DEDUP_KEY`` when the sender set one (the outbox: a row sent again gets a
    new ``UNIQ_KEY``), else ``UNIQ_KEY`` (the same on every copy of a message), else the id."""
    props = message.properties
    return props.get(DEDUP_KEY) or props.get(UNIQ_KEY) or message.message_id


class DuplicateMessage(Exception):
    """Internal signal: the dedup insert hit an existing row."""


def record_consumed(session: Session, group: str, message: Message, key: str, topic: str) -> None:
    """Insert the dedup row of ``message`` in ``session``'s transaction (under a savepoint, so
    a duplicate leaves the transaction usable).

    Raises:
        DuplicateMessage: the row exists: the message was applied before.
    """
    try:
        with session.begin_nested():
            session.execute(
                insert(ConsumedMessage).values(
                    consumer_group=group,
                    message_key=key,
                    topic=message.topic or topic,
                    message_id=message.message_id,
                    consumed_at=utcnow(),
                )
            )
    except IntegrityError as exc:
        raise DuplicateMessage(key) from exc


class IdempotentHandler:
    """What the sync and the ``async def`` idempotent consumers share: the dedup key, the
    counters and the duplicate's log line; their SQL is :func:`record_consumed` and
    :func:`count_duplicate`, which the async consumer awaits through ``run_sync``."""

    fn: Callable[..., Any]

    def __init__(
        self, fn: Callable[..., Any], session_factory: Any, group: str, topic: str
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
        self._lock = threading.Lock()  # counters: the consuming threads (or loop) and readers
        self.applied = 0
        self.duplicates = 0
        self.__name__ = getattr(fn, "__name__", "idempotent_consumer")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def key(self, message: Message) -> str:
        """The message's dedup key (:func:`message_key`).

        Raises:
            InvalidMessageError: the message has none.
        """
        key = message_key(message)
        if not key:
            raise InvalidMessageError(
                f"group={self.group}: message without UNIQ_KEY or message id cannot be "
                "de-duplicated; send it with the txmsg producer or the RocketMQ client"
            )
        return key

    def _applied(self) -> None:
        with self._lock:
            self.applied += 1

    def _absorbed(self, message: Message, key: str) -> str:
        """Count and log a duplicate; its topic (for :func:`count_duplicate`)."""
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
        return topic

    def _not_counted(self, key: str) -> None:
        log.exception("group=%s key=%s: could not count the duplicate", self.group, key)


class IdempotentConsumer(IdempotentHandler):
    """The consumer :func:`wrap_idempotent` returns: ``consumer(message)``; counters readable."""

    fn: Handler
    session_factory: SessionFactory

    def __init__(
        self,
        fn: Handler,
        session_factory: SessionFactory,
        group: str,
        topic: str,
    ) -> None:
        super().__init__(fn, session_factory, group, topic)

    def __call__(self, message: Message) -> None:
        self.apply(message)

    def apply(
        self,
        message: Message,
        *,
        in_same_transaction: Callable[[Session], object] | None = None,
    ) -> bool:
        """Apply ``message`` once: True = applied now, False = a duplicate (already applied).

        ``in_same_transaction(session)`` runs after ``fn`` in the same database transaction, and
        only when the message is applied: replaying a parked message deletes its parked row
        there, so the effects and the row's removal commit together (:mod:`txmsg.sqla.parking`).
        """
        key = self.key(message)
        try:
            with self.session_factory() as session, session.begin():
                record_consumed(session, self.group, message, key, self.topic)
                self.fn(message, session)
                if in_same_transaction is not None:
                    in_same_transaction(session)
        except DuplicateMessage:
            topic = self._absorbed(message, key)
            try:
                with self.session_factory() as session:
                    count_duplicate(session, self.group, topic)
            except Exception:  # noqa: BLE001 - logged with its traceback
                self._not_counted(key)
            return False
        self._applied()
        return True


def wrap_idempotent(
    fn: Handler,
    session_factory: SessionFactory | None = None,
    group: str = "",
    topic: str = "",
) -> IdempotentConsumer:
    """Make ``fn(message, session)`` an idempotent consumer of ``topic`` for ``group``.

    Called by ``message_listener(..., idempotent=True, session_factory=...)``.
    """
    if session_factory is None:
        raise ListenerDefinitionError(
            "idempotent=True needs session_factory=...: a callable returning SQLAlchemy sessions "
            "on the database where the handler writes its effects"
        )
    return IdempotentConsumer(fn, session_factory, group, topic)


def count_duplicate(session: Session, group: str, topic: str) -> None:
    """Add one to the duplicates of ``group``/``topic`` in ``txmsg_consume_stat``, in
    transactions of its own on ``session`` (none may be open)."""
    for _ in range(3):
        now = utcnow()
        with session.begin():
            result = session.execute(
                update(ConsumeStat)
                .where(ConsumeStat.consumer_group == group, ConsumeStat.topic == topic)
                .values(duplicates=ConsumeStat.duplicates + 1, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            if getattr(result, "rowcount", 0) == 1:
                return
        try:
            with session.begin():
                session.execute(
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


def duplicates_absorbed(
    session_factory: SessionFactory, group: str | None = None, topic: str | None = None
) -> int:
    """Duplicates absorbed so far (from the stats table, so across processes and restarts)."""
    with session_factory() as session, session.begin():
        read_only(session)
        query = select(func.coalesce(func.sum(ConsumeStat.duplicates), 0))
        if group is not None:
            query = query.where(ConsumeStat.consumer_group == group)
        if topic is not None:
            query = query.where(ConsumeStat.topic == topic)
        return int(session.scalar(query) or 0)


def consumed_count(session_factory: SessionFactory, group: str | None = None) -> int:
    """Messages applied (dedup rows) so far."""
    with session_factory() as session, session.begin():
        read_only(session)
        query = select(func.count()).select_from(ConsumedMessage)
        if group is not None:
            query = query.where(ConsumedMessage.consumer_group == group)
        return int(session.scalar(query) or 0)


def purge_consumed(
    session_factory: SessionFactory,
    older_than: timedelta,
    *,
    now: datetime | None = None,
) -> int:
    """Forget dedup rows older than ``older_than`` (keep it longer than redelivery can happen:
    retries with RocketMQ's delay levels span about two days)."""
    cutoff = (now or utcnow()) - older_than
    with session_factory() as session, session.begin():
        result = session.execute(
            delete(ConsumedMessage)
            .where(ConsumedMessage.consumed_at < cutoff)
            .execution_options(synchronize_session=False)
        )
        return int(getattr(result, "rowcount", 0) or 0)
