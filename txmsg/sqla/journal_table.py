"""The SQL of the orderly in-flight journal's table (``txmsg_orderly_inflight``), built once.

Every orderly message runs some of these statements, and building a statement cost more than
running it, so they are module constants; :mod:`txmsg.sqla.journal` (what the rows mean) and
its sweeper share them.  The transactions run on a Core connection when the session factory is
bound to an engine (the ORM session cost more than the statements), else on a session.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, and_, bindparam, delete, or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from txmsg.message import Message
from txmsg.sqla.engine import SessionFactory, bound_engine, read_only
from txmsg.sqla.models import OrderlyInflight
from txmsg.sqla.parking import _insert_once

log = logging.getLogger("txmsg.journal")


@dataclass(frozen=True)
class Leftover:
    """A journal row another consumer left behind, and the message it holds."""

    id: int
    owner: str
    lease_until: datetime
    message: Message


TABLE: Table = OrderlyInflight.__table__  # type: ignore[assignment]  # declared a Table
_T = TABLE.c
# Built once: every orderly message runs them (building a statement cost more than running it).
ROW = select(_T.id, _T.owner, _T.lease_until).where(
    _T.consumer_group == bindparam("group"), _T.message_key == bindparam("message_key")
)
_EARLIER = select(TABLE).where(
    _T.consumer_group == bindparam("group"),
    _T.sharding_key == bindparam("key"),
    _T.topic == bindparam("topic"),
    _T.id != bindparam("row_id"),
)
EARLIER_IN_QUEUE = _EARLIER.where(
    or_(
        and_(_T.queue_id == bindparam("queue_id"), _T.queue_offset < bindparam("queue_offset")),
        # the key on another queue: the topic's queue count changed while its consumer was dead
        # (the key hashes to a new queue now); that row was written first, so it comes first
        and_(_T.queue_id != bindparam("queue_id"), _T.id < bindparam("row_id")),
    )
).order_by(_T.id)
EARLIER_BY_ID = _EARLIER.where(_T.id < bindparam("row_id")).order_by(_T.id)
CLAIM = (
    update(TABLE)
    .where(
        _T.id == bindparam("row_id"),
        _T.owner == bindparam("old_owner"),
        _T.lease_until == bindparam("old_lease"),
    )
    .values(owner=bindparam("new_owner"), lease_until=bindparam("new_lease"))
)
DELETE = delete(TABLE).where(_T.id == bindparam("row_id"))
KEYS = select(_T.topic, _T.sharding_key).where(_T.consumer_group == bindparam("group")).distinct()
_INSERT_RETURNING: dict[str, Any] = {}


def insert_returning_id(tx: Connection | Session, values: dict[str, Any]) -> int | None:
    """Insert the row; its id, or None when the message's row is there already (a redelivery).
    PostgreSQL and SQLite do it in one statement (``ON CONFLICT DO NOTHING RETURNING id``)."""
    dialect = tx.dialect.name if isinstance(tx, Connection) else tx.get_bind().dialect.name
    if dialect in ("postgresql", "sqlite"):
        statement = _INSERT_RETURNING.get(dialect)
        if statement is None:
            dialect_insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
            statement = _INSERT_RETURNING[dialect] = (
                dialect_insert(TABLE).on_conflict_do_nothing().returning(_T.id)
            )
        row_id = tx.execute(statement, values).scalar()
        return None if row_id is None else int(row_id)
    if not _insert_once(tx, OrderlyInflight, values):
        return None
    found = tx.execute(
        ROW, {"group": values["consumer_group"], "message_key": values["message_key"]}
    ).one()
    return int(found.id)


def claim_row(
    tx: Connection | Session,
    row: tuple[int, str, datetime],
    new_owner: str,
    new_lease: datetime,
    group: str,
    why: str,
) -> bool:
    """Compare-and-set on the row's (owner, lease): of two consumers claiming one row, one wins.
    ``row`` is (id, owner, lease_until) as read; taking a gone consumer's row is logged with
    ``why``."""
    row_id, owner, lease_until = row
    result = tx.execute(
        CLAIM,
        {
            "row_id": row_id,
            "old_owner": owner,
            "old_lease": lease_until,
            "new_owner": new_owner,
            "new_lease": new_lease,
        },
    )
    claimed = getattr(result, "rowcount", 0) == 1
    if claimed and owner != new_owner:
        log.warning(
            "group=%s: finishing row %d left by consumer %s (gone), %s; see "
            "docs/librocketmq-hazards.md #10",
            group,
            row_id,
            owner,
            why,
        )
    return claimed


@contextmanager
def begin_write(session_factory: SessionFactory) -> Iterator[Connection | Session]:
    """One write transaction: a Core connection when the factory is a ``sessionmaker`` bound
    to an engine (every orderly message pays this, and the ORM session cost more than the
    statements), else a session."""
    engine = bound_engine(session_factory)
    if engine is not None:
        with engine.begin() as connection:
            yield connection
        return
    with session_factory() as session, session.begin():
        yield session


@contextmanager
def begin_read(session_factory: SessionFactory) -> Iterator[Connection | Session]:
    """One read: a Core connection when the factory is bound to an engine, else a read-only
    session."""
    engine = bound_engine(session_factory)
    if engine is not None:
        with engine.connect() as connection:
            yield connection
        return
    with session_factory() as session, session.begin():
        read_only(session)
        yield session
