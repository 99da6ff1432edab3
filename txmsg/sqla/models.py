"""Tables the SQLAlchemy layer keeps next to the application's own tables.

They live on their own ``MetaData`` (:data:`metadata`) so an application with its own declarative
base creates them with :func:`create_tables` (or adds ``txmsg.sqla.models.metadata`` to its
Alembic ``target_metadata``).  They must be in the *same database* as the business tables: the
point is that the record and the business change commit in one transaction.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    Engine,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from txmsg.errors import TxMsgError

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every database.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so values are stored as UTC and
    given their zone back when read.  Naive datetimes are refused: they are the classic source of
    "older than the grace period" bugs.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise TxMsgError("txmsg timestamps must be timezone-aware (use datetime.now(UTC))")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TxMsgError(f"expected a datetime from the database, got {type(value).__name__}")
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class RecordState(enum.StrEnum):
    """State of a transaction record.

    ``IN_FLIGHT``: the local transaction has started and not finished (written in its own short
    transaction before the business transaction).  ``COMMITTED``: written in the business
    transaction itself, so it exists exactly when the business change does.  ``ROLLED_BACK``: a
    marker written after a rollback, or by a check that gave up on a missing/stale transaction;
    it fences any late attempt to commit the same transaction key.
    """

    IN_FLIGHT = "IN_FLIGHT"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"


class TxMsgBase(DeclarativeBase):
    metadata = metadata


class _RecordColumns:
    """The columns of a transaction record, declared once: the archive keeps exactly what the
    record held (retention copies a row across column by column), so the two cannot drift."""

    transaction_key: Mapped[str] = mapped_column(String(128), primary_key=True)
    producer_group: Mapped[str] = mapped_column(String(255))
    topic: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16))
    keys: Mapped[str | None] = mapped_column(String(255), default=None)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())


class TransactionRecord(_RecordColumns, TxMsgBase):
    """One row per transactional message; the key is the message's ``UNIQ_KEY``.

    The check query is a primary-key lookup; retention scans ``updated_at`` through its index.
    """

    __tablename__ = "txmsg_transaction_record"

    __table_args__ = (
        Index(None, "updated_at"),
        Index(None, "producer_group", "state"),
    )


class TransactionRecordArchive(_RecordColumns, TxMsgBase):
    """Where retention moves old records when asked to archive instead of delete."""

    __tablename__ = "txmsg_transaction_record_archive"

    archived_at: Mapped[datetime] = mapped_column(UtcDateTime(), sort_order=1)
    """After the record's columns (``sort_order``: a class's own columns otherwise come before
    its mixin's)."""


class ConsumedMessage(TxMsgBase):
    """Dedup table of idempotent consumers: a row means "this group already applied this message".

    Inserted in the same transaction as the handler's effects, so it exists exactly when they do.
    """

    __tablename__ = "txmsg_consumed_message"

    consumer_group: Mapped[str] = mapped_column(String(255), primary_key=True)
    message_key: Mapped[str] = mapped_column(String(128), primary_key=True)
    topic: Mapped[str] = mapped_column(String(255))
    message_id: Mapped[str | None] = mapped_column(String(128), default=None)
    consumed_at: Mapped[datetime] = mapped_column(UtcDateTime())

    __table_args__ = (Index(None, "consumed_at"),)


class ConsumeStat(TxMsgBase):
    """Per consumer group and topic: duplicates absorbed (applied ones are the dedup rows)."""

    __tablename__ = "txmsg_consume_stat"

    consumer_group: Mapped[str] = mapped_column(String(255), primary_key=True)
    topic: Mapped[str] = mapped_column(String(255), primary_key=True)
    duplicates: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"))
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())


class ParkedKey(TxMsgBase):
    """A sharding key an orderly consumer group has parked (:mod:`txmsg.orderly`).

    While this row exists, every message of the key the group receives is parked behind the first
    one instead of being handled.  Its row is the lock of the parking protocol: the consumer
    parking "behind" and the replay unparking the key both lock it first (``SELECT ... FOR
    UPDATE`` on PostgreSQL; SQLite serialises writers with ``BEGIN IMMEDIATE``), so a message is
    never parked behind a key that replay has just released.
    """

    __tablename__ = "txmsg_parked_key"

    consumer_group: Mapped[str] = mapped_column(String(255), primary_key=True)
    sharding_key: Mapped[str] = mapped_column(String(255), primary_key=True)
    topic: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text())
    """The error that parked the key (the last one, after a failed replay)."""
    first_message_id: Mapped[str | None] = mapped_column(String(128), default=None)
    parked_at: Mapped[datetime] = mapped_column(UtcDateTime())


class StoredMessage:
    """The columns of a whole message kept for a consumer group (a parked message, an in-flight
    one): enough to hand it to the listener again (:func:`txmsg.sqla.parking.stored_message`)."""

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    consumer_group: Mapped[str] = mapped_column(String(255))
    sharding_key: Mapped[str] = mapped_column(String(255))
    topic: Mapped[str] = mapped_column(String(255))
    message_key: Mapped[str] = mapped_column(String(128))
    """``UNIQ_KEY`` of the message, else its message id."""
    message_id: Mapped[str | None] = mapped_column(String(128), default=None)
    tags: Mapped[str | None] = mapped_column(String(255), default=None)
    keys: Mapped[str | None] = mapped_column(String(255), default=None)
    properties: Mapped[dict[str, str]] = mapped_column(JSON())
    body: Mapped[bytes] = mapped_column(LargeBinary())
    reconsume_times: Mapped[int] = mapped_column(Integer(), default=0)
    queue_id: Mapped[int | None] = mapped_column(Integer(), default=None)
    queue_offset: Mapped[int | None] = mapped_column(BigInteger(), default=None)


class ParkedMessage(StoredMessage, TxMsgBase):
    """A message of a parked key, kept whole so replay can hand it to the listener again.

    ``id`` increases in the order the consumer parked the messages, which is the queue's order:
    replay goes by ``id``.  ``(consumer_group, message_key)`` is unique so a message handed
    again after a crash (parked, but the consumer died before the broker learnt the offset) is
    not parked twice.
    """

    __tablename__ = "txmsg_parked_message"

    error: Mapped[str | None] = mapped_column(Text(), default=None)
    """Why this message could not be handled; None for one parked behind a failed one."""
    attempts: Mapped[int] = mapped_column(Integer(), default=0)
    """Attempts of the handler so far (live consumption plus replays)."""
    parked_at: Mapped[datetime] = mapped_column(UtcDateTime())

    __table_args__ = (
        UniqueConstraint("consumer_group", "message_key"),
        Index(None, "consumer_group", "sharding_key", "id"),
    )


class OrderlyInflight(StoredMessage, TxMsgBase):
    """An orderly message whose listener is running (or was, in a consumer that died).

    Why it exists: librocketmq 2.1.0's orderly push consumer can commit a queue's offset past a
    message still in its callback (docs/librocketmq-hazards.md #10), so a consumer killed there
    would lose the message for good.  The orderly handler writes the row before the listener
    runs and deletes it when the message is consumed or parked (:mod:`txmsg.sqla.journal`).  A
    row whose ``owner`` is gone is a message to finish: the next consumer of its key handles it
    before the key's later messages, and every consumer's sweeper picks up the rest.

    ``id`` is the order the rows were written (a key's messages come one at a time, in queue
    order).  ``(consumer_group, message_key)`` is unique: a redelivered message reuses its row.
    """

    __tablename__ = "txmsg_orderly_inflight"

    owner: Mapped[str] = mapped_column(String(255))
    """``host:pid:token`` of the consumer process handling it."""
    lease_until: Mapped[datetime] = mapped_column(UtcDateTime())
    """The owner renews this while the listener runs; past it, the row is anybody's to finish."""

    __table_args__ = (
        UniqueConstraint("consumer_group", "message_key"),
        Index(None, "consumer_group", "sharding_key", "id"),
    )


def create_tables(engine: Engine) -> None:
    """Create the txmsg tables that do not exist yet (idempotent)."""
    metadata.create_all(engine)
