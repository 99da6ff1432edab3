"""The outbox's tables, on txmsg's own metadata (:data:`txmsg.sqla.models.metadata`).

Why on that metadata: they must live in the service's *business* database (the point of an outbox
is that the message row commits with the business change), and every service already creates
txmsg's tables there with :func:`txmsg.sqla.create_tables` or through Alembic's
``target_metadata``; the outbox rides the same path with no extra step.

* ``txmsg_outbox_message``: one row per message not yet sent (sent rows are deleted: the table
  holds only work, so the relay's queries stay small), or dead (kept for an operator).
* ``txmsg_outbox_key``: one row per sharding key, the lock a writing transaction holds while it
  numbers its row (``seq``), so a key's numbers follow the order its transactions commit.  The row
  carries no state the relay depends on: an idle one may be deleted at any time
  (:func:`txmsg.sqla.outbox.store.purge_idle_keys`).
* ``txmsg_outbox_relay``: on SQLite, the lease of the one relay that serves an outbox in that
  database (SQLite has no row locks for relays to share rows by).
"""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import JSON, BigInteger, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from txmsg.sqla.models import TxMsgBase, UtcDateTime


class OutboxState(enum.StrEnum):
    """``PENDING``: to be sent (now, or at ``next_attempt_at`` after a failure).  ``DEAD``: no
    more attempts (the last one failed, or the message can never be sent); it holds back its
    key's later rows until ``txmsg outbox retry`` or ``discard``."""

    PENDING = "PENDING"
    DEAD = "DEAD"


class OutboxMessage(TxMsgBase):
    """A message written by :meth:`txmsg.sqla.outbox.Outbox.send` in the caller's transaction.

    ``id`` is only an identity: on PostgreSQL ids are not commit order (a later id can commit
    first).  A row with a ``sharding_key`` has a ``seq`` numbered under the key's lock row, so
    within one key ``seq`` order is commit order; the relay sends a key's row only once no row
    with a smaller ``seq`` of that key is left (sent rows are deleted).  ``message_key`` is the
    row's stable identity, sent as the :data:`txmsg.message.DEDUP_KEY` property: a row sent twice
    (the relay died between the broker's answer and the row's deletion) is absorbed as a
    duplicate by idempotent consumers.
    """

    __tablename__ = "txmsg_outbox_message"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    outbox: Mapped[str] = mapped_column(String(255))
    """The outbox's group (its producer group): several outboxes may share a database."""
    message_key: Mapped[str] = mapped_column(String(64), unique=True)
    topic: Mapped[str] = mapped_column(String(255))
    tags: Mapped[str | None] = mapped_column(String(255), default=None)
    keys: Mapped[str | None] = mapped_column(Text(), default=None)
    properties: Mapped[dict[str, str]] = mapped_column(JSON())
    body: Mapped[bytes] = mapped_column(LargeBinary())
    sharding_key: Mapped[str | None] = mapped_column(String(255), default=None)
    seq: Mapped[int | None] = mapped_column(BigInteger(), default=None)
    """Position within the sharding key (commit order); None for rows without a key."""
    delay_level: Mapped[int | None] = mapped_column(Integer(), default=None)
    deliver_at_ms: Mapped[int | None] = mapped_column(BigInteger(), default=None)
    state: Mapped[str] = mapped_column(String(8), default=OutboxState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer(), default=0)
    """Failed sends so far."""
    next_attempt_at: Mapped[datetime] = mapped_column(UtcDateTime())
    """When the relay may send it: the commit time at first, later the end of its back-off."""
    last_error: Mapped[str | None] = mapped_column(Text(), default=None)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    dead_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), default=None)

    __table_args__ = (
        # the relay's due rows (oldest due first), the stats' oldest unsent row
        Index(None, "outbox", "state", "next_attempt_at"),
        # "no earlier row of the key is left", and one seq per key (NULL keys never collide)
        Index(None, "outbox", "sharding_key", "seq", unique=True),
    )


class OutboxKey(TxMsgBase):
    """The lock row of one sharding key of one outbox (see the module docstring)."""

    __tablename__ = "txmsg_outbox_key"

    outbox: Mapped[str] = mapped_column(String(255), primary_key=True)
    sharding_key: Mapped[str] = mapped_column(String(255), primary_key=True)
    used_at: Mapped[datetime] = mapped_column(UtcDateTime())
    """Last time a writer numbered a row of the key (the purge of idle rows reads it)."""

    __table_args__ = (Index(None, "used_at"),)


class OutboxRelayLease(TxMsgBase):
    """Who relays an outbox in this database, on SQLite (one relay per outbox and database).

    ``owner`` is ``host:pid:token`` like the orderly journal's owners: a relay whose process is
    gone on this host is replaced at once, any other once ``lease_until`` has passed (the holder
    renews it every few seconds)."""

    __tablename__ = "txmsg_outbox_relay"

    outbox: Mapped[str] = mapped_column(String(255), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    lease_until: Mapped[datetime] = mapped_column(UtcDateTime())
    since: Mapped[datetime] = mapped_column(UtcDateTime())
