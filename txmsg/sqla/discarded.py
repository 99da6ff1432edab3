"""Dead rows of discarded half messages the rescuer gave up on (:mod:`txmsg.rescue`).

Why in the listener's database: that is where a record-backed listener's transaction records
are, which ``check_local`` answers from, so an operator who fixes the cause (a record written
late, a service back up) retries from the same place (``txmsg discarded retry``); and it is
where the outbox keeps its dead rows too.  The table rides on txmsg's metadata:
:func:`txmsg.sqla.create_tables` (or Alembic with ``txmsg.sqla.metadata``) creates it.

One row per producer group and transaction key: a transaction whose half message the broker
discarded twice (a re-put copy, ``docs/rocketmq-facts.md``) is one row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    select,
)
from sqlalchemy import delete as sql_delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from txmsg.message import Message
from txmsg.rescue import DiscardedEvent
from txmsg.sqla.engine import SessionFactory
from txmsg.sqla.models import TxMsgBase, UtcDateTime, utcnow
from txmsg.sqla.views import message_of, view_of

log = logging.getLogger("txmsg.rescue")


class DiscardedMessage(TxMsgBase):
    """A discarded half message whose ``check_local`` never answered (see the module docstring)."""

    __tablename__ = "txmsg_discarded_message"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    producer_group: Mapped[str] = mapped_column(String(255))
    transaction_key: Mapped[str] = mapped_column(String(128))
    """The half message's ``UNIQ_KEY`` (what ``check_local`` and the records know it by)."""
    topic: Mapped[str] = mapped_column(String(255))
    """Its real topic, where a rescue sends it."""
    tags: Mapped[str | None] = mapped_column(String(255), default=None)
    keys: Mapped[str | None] = mapped_column(Text(), default=None)
    properties: Mapped[dict[str, str]] = mapped_column(JSON())
    """Every property it was consumed with (the broker's too; a rescue drops those)."""
    body: Mapped[bytes] = mapped_column(LargeBinary())
    attempts: Mapped[int] = mapped_column(Integer())
    reason: Mapped[str] = mapped_column(Text())
    dead_at: Mapped[datetime] = mapped_column(UtcDateTime())

    __table_args__ = (UniqueConstraint("producer_group", "transaction_key"),)


@dataclass(frozen=True)
class DiscardedView:
    """A dead row, detached from its session."""

    id: int
    group: str
    transaction_key: str
    message: Message
    attempts: int
    reason: str
    dead_at: datetime


def _view(row: DiscardedMessage) -> DiscardedView:
    return view_of(
        DiscardedView,
        row,
        group=row.producer_group,
        message=message_of(row, message_id=row.transaction_key),
    )


class SqlDeadStore:
    """:class:`txmsg.rescue.DeadStore` in a listener's database."""

    durable = True

    def __init__(self, sessions: SessionFactory) -> None:
        self.sessions = sessions

    def add(self, event: DiscardedEvent) -> bool:
        """Write (or refresh) the row of ``event``; True once committed.  Raises the database's
        error (the rescuer logs it and keeps the event in memory)."""
        key = event.transaction_key or event.message.message_id or ""
        message = event.message
        try:
            with self.sessions() as session, session.begin():
                row = session.scalars(
                    select(DiscardedMessage).where(
                        DiscardedMessage.producer_group == event.group,
                        DiscardedMessage.transaction_key == key,
                    )
                ).first()
                if row is None:
                    session.add(
                        DiscardedMessage(
                            producer_group=event.group,
                            transaction_key=key,
                            topic=event.topic,
                            tags=message.tags,
                            keys=message.keys,
                            properties=dict(message.properties),
                            body=bytes(message.body),
                            attempts=event.attempts,
                            reason=event.reason,
                            dead_at=utcnow(),
                        )
                    )
                else:
                    row.attempts += event.attempts
                    row.reason = event.reason
                    row.dead_at = utcnow()
        except IntegrityError:  # another instance wrote it meanwhile: one row is the point
            log.info("group %s: the dead row of %s exists already", event.group, key)
        return True


def dead_rows(
    sessions: SessionFactory, group: str | None = None, key: str | None = None
) -> list[DiscardedView]:
    """The dead rows (of ``group``, of transaction ``key``), oldest first."""
    query = select(DiscardedMessage).order_by(DiscardedMessage.dead_at, DiscardedMessage.id)
    if group is not None:
        query = query.where(DiscardedMessage.producer_group == group)
    if key is not None:
        query = query.where(DiscardedMessage.transaction_key == key)
    with sessions() as session:
        return [_view(row) for row in session.scalars(query)]


def discard_dead(sessions: SessionFactory, group: str, keys: list[str] | None = None) -> int:
    """Delete the dead rows of ``group`` (only ``keys`` when given); how many went."""
    statement = sql_delete(DiscardedMessage).where(DiscardedMessage.producer_group == group)
    if keys is not None:
        statement = statement.where(DiscardedMessage.transaction_key.in_(keys))
    with sessions() as session, session.begin():
        return int(session.execute(statement).rowcount or 0)  # type: ignore[attr-defined]
