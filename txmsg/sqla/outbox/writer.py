"""Writing an outbox row in the caller's transaction: validation, the key lock, the row.

What :meth:`txmsg.sqla.outbox.Outbox.send` does, split out because it is the commit path of
every business transaction that publishes: it must refuse at once what could never be sent (the
caller can still decide what to do, inside its transaction), and must number a sharding key's
rows in the order their transactions commit.

Why the lock: on PostgreSQL a sequence or ``BIGSERIAL`` is handed out when a row is inserted, not
when its transaction commits, so transaction A can take id 100, B id 101, and B commit first; a
relay sending by id would send 101 before 100 exists.  So a writer first upserts the key's row in
``txmsg_outbox_key`` (``INSERT ... ON CONFLICT DO UPDATE``: a row lock held until the writing
transaction ends), and only then numbers its row ``seq = max(seq of the key's rows) + 1``.  A
second writer of the key waits at the upsert until the first has committed (or rolled back), so
it sees the first one's row and numbers after it: within a key, ``seq`` order is commit order.
Writers of different keys never wait for each other.  On SQLite every writer holds the database's
write lock from its first write until it commits, so numbering inside the INSERT gives the same
order without the lock row (:func:`write_row`).

Rows sent by the relay are deleted, so ``max(seq)`` may go down (to nothing: the next row is 1).
That is fine: only the rows still in the table need an order, and a key's row can be deleted at
any time without breaking it (:func:`txmsg.sqla.outbox.store.purge_idle_keys`).
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Dialect,
    Table,
    bindparam,
    func,
    insert,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from txmsg.convert import to_body
from txmsg.errors import InvalidMessageError
from txmsg.message import DEDUP_KEY, SHARDING_KEY, UNIQ_KEY
from txmsg.names import NameRule, check_name
from txmsg.sending import RowOptions, SendOptions
from txmsg.sqla.models import utcnow
from txmsg.sqla.outbox.models import OutboxKey, OutboxMessage, OutboxState

RESERVED_PROPERTIES = frozenset({SHARDING_KEY, DEDUP_KEY, UNIQ_KEY})
"""Properties the outbox or the client sets; a row may not carry its own."""

_MAX_NAME = 255  # the String(255) column of tags

_MESSAGES: Table = OutboxMessage.__table__  # type: ignore[assignment]  # declared a Table
_KEYS: Table = OutboxKey.__table__  # type: ignore[assignment]  # declared a Table
_M = _MESSAGES.c
_K = _KEYS.c

_INSERT_ROW = insert(_MESSAGES).returning(_M.id)
_MAX_SEQ = select(func.max(_M.seq)).where(
    _M.outbox == bindparam("seq_outbox"), _M.sharding_key == bindparam("seq_key")
)
_NEXT_SEQ = (
    select(func.coalesce(func.max(_M.seq), 0) + 1)
    .where(_M.outbox == bindparam("seq_outbox"), _M.sharding_key == bindparam("seq_key"))
    .scalar_subquery()
)
_INSERT_KEYED_ROW = insert(_MESSAGES).values(seq=_NEXT_SEQ).returning(_M.id, _M.seq)
_NOTIFY = func.pg_notify(bindparam("notify_channel"), literal("")).is_(None)
"""PostgreSQL: the relays' wake-up, delivered when the writer's transaction commits
(:mod:`txmsg.sqla.outbox.notify`), evaluated in the row's INSERT: no round trip of its own."""
_INSERT_ROW_NOTIFY = insert(_MESSAGES).returning(_M.id, _NOTIFY)
_INSERT_KEYED_ROW_NOTIFY = insert(_MESSAGES).values(seq=_NEXT_SEQ).returning(_M.id, _M.seq, _NOTIFY)
"""A keyed row numbered in the INSERT itself: one statement, so on SQLite the number is taken
under the write lock the INSERT holds (see :func:`write_row`)."""
_TOUCH_KEY = (
    update(_KEYS)
    .where(_K.outbox == bindparam("outbox"), _K.sharding_key == bindparam("key"))
    .values(used_at=bindparam("now"))
)
_UPSERT_KEY: dict[str, Any] = {}


@dataclass(frozen=True)
class _DriverInsert:
    """The outbox INSERT as the driver's own SQL with the columns' bind processors, for SQLite.

    Why: the row is written in every publishing transaction, and SQLAlchemy's Core execution of
    a cached statement (parameter processing, compiled-cache lookup, result set-up) costs the
    writer's thread as much as SQLite's own work for the row and its three indexes
    (docs/guide/outbox.md#measured); ``exec_driver_sql`` keeps the engine's events (tracing,
    logging) without that work.  The SQL is SQLAlchemy's own compilation of the INSERT, and the
    values go through the bind processors a Core INSERT applies (``UtcDateTime`` text, JSON):
    the stored row is the same, which tests/outbox/test_outbox_units.py pins for every column
    type."""

    sql: str
    names: tuple[str, ...]
    keyed_sql: str
    keyed_names: tuple[str, ...]
    processors: dict[str, Callable[[Any], Any]]

    @classmethod
    def of(cls, dialect: Dialect) -> _DriverInsert:
        columns = [c for c in _MESSAGES.c if c.name not in ("id", "seq")]
        row: dict[str, Any] = {c.name: bindparam(c.name) for c in columns}
        next_seq = (
            select(func.coalesce(func.max(_M.seq), literal_column("0")) + literal_column("1"))
            .where(_M.outbox == bindparam("seq_outbox"), _M.sharding_key == bindparam("seq_key"))
            .scalar_subquery()
        )
        plain = insert(_MESSAGES).values(row).returning(_M.id, _M.seq).compile(dialect=dialect)
        keyed = (
            insert(_MESSAGES)
            .values({**row, "seq": next_seq})
            .returning(_M.id, _M.seq)
            .compile(dialect=dialect)
        )
        processors: dict[str, Callable[[Any], Any]] = {}
        for column in columns:
            processor = column.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                processors[column.name] = processor
        return cls(
            sql=plain.string,
            names=tuple(plain.positiontup or ()),
            keyed_sql=keyed.string,
            keyed_names=tuple(keyed.positiontup or ()),
            processors=processors,
        )

    def insert(self, connection: Connection, values: Mapping[str, Any]) -> tuple[int, Any]:
        """Insert ``values`` (numbered in the INSERT when it has a sharding key); (id, seq)."""
        key = values["sharding_key"]
        if key is None:
            sql, names, given = self.sql, self.names, values
        else:
            sql, names = self.keyed_sql, self.keyed_names
            given = {**values, "seq_outbox": values["outbox"], "seq_key": key}
        processors = self.processors
        params = []
        for name in names:
            value = given[name]
            processor = processors.get(name)
            params.append(value if processor is None or value is None else processor(value))
        row = connection.exec_driver_sql(sql, tuple(params)).one()
        return int(row[0]), row[1]


_DRIVER_INSERTS: weakref.WeakKeyDictionary[Dialect, _DriverInsert] = weakref.WeakKeyDictionary()


def _driver_insert(dialect: Dialect) -> _DriverInsert:
    found = _DRIVER_INSERTS.get(dialect)
    if found is None:
        found = _DRIVER_INSERTS[dialect] = _DriverInsert.of(dialect)
    return found


@dataclass(frozen=True)
class OutboxReceipt:
    """What :meth:`~txmsg.sqla.outbox.Outbox.send` wrote (visible once the caller commits)."""

    id: int
    message_key: str
    """The row's stable key: the ``TXMSG_DEDUP_KEY`` property of every copy the relay sends."""
    seq: int | None
    """Its place among the unsent rows of its sharding key (None without a key)."""


def row_values(
    outbox: str,
    topic: str,
    payload: Any,
    options: RowOptions,
    *,
    name_rules: tuple[NameRule, ...],
    max_body_bytes: int,
) -> dict[str, Any]:
    """The columns of a row for this message, or an error saying what to change.

    Everything refused here could never be sent, whatever the broker's state: refusing it in the
    caller's transaction beats a dead row later.  The options are validated as a send's
    (:meth:`txmsg.sending.SendOptions.of`); what only the backend knows (its own size limit,
    whether it can deliver at a time, the topic's type on the broker) is judged by the relay,
    which makes such a row dead at its first attempt, with the backend's reason.

    Raises:
        InvalidNameError: RocketMQ or the app's backend refuses the topic name.
        InvalidMessageError: the payload cannot be converted or is larger than
            ``max_body_bytes``; an invalid option, a reserved property, a tag longer than its
            column.
    """
    owner = f"outbox {outbox}: topic={topic}"
    check_name("topic", topic, owner=f"outbox {outbox}: send", rules=name_rules)
    sending = SendOptions.of(owner, options, reserved=RESERVED_PROPERTIES)
    tags = sending.tags
    if tags is not None and (not isinstance(tags, str) or len(tags) > _MAX_NAME):
        raise InvalidMessageError(
            f"{owner}: tags must be a string of at most {_MAX_NAME} characters, got {tags!r}"
        )
    body = to_body(payload)
    if len(body) > max_body_bytes:
        raise InvalidMessageError(
            f"{owner}: the body is {len(body)} bytes, over the outbox's max_body_bytes "
            f"({max_body_bytes}, a broker's maxMessageSize): it could never be sent. Store the "
            "payload elsewhere (object storage) and send its reference"
        )
    now = utcnow()
    return {
        "outbox": outbox,
        "message_key": uuid.uuid4().hex,
        "topic": topic,
        "tags": tags,
        "keys": sending.keys,
        "properties": sending.properties,
        "body": body,
        "sharding_key": sending.sharding_key,
        "seq": None,
        "delay_level": sending.delay_level,
        "deliver_at_ms": sending.deliver_at_ms,
        "state": OutboxState.PENDING.value,
        "attempts": 0,
        "next_attempt_at": now,
        "last_error": None,
        "created_at": now,
        "dead_at": None,
    }


def lock_key(session: Session, outbox: str, key: str, now: datetime) -> None:
    """Take the key's lock row for the rest of the caller's transaction (see the module doc)."""
    connection = session.connection()
    dialect = connection.dialect.name
    params = {"outbox": outbox, "sharding_key": key, "used_at": now}
    if dialect in ("postgresql", "sqlite"):
        statement = _UPSERT_KEY.get(dialect)
        if statement is None:
            dialect_insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
            upsert = dialect_insert(_KEYS)
            statement = _UPSERT_KEY[dialect] = upsert.on_conflict_do_update(
                index_elements=[_K.outbox, _K.sharding_key],
                set_={"used_at": upsert.excluded.used_at},
            )
        connection.execute(statement, params)  # the transaction's connection, not the ORM
        return
    # other databases: update (locks an existing row), else insert; a concurrent first insert
    # of the same key loses on the primary key and updates (then waits for the winner's lock)
    touch = {"outbox": outbox, "key": key, "now": now}
    if getattr(session.execute(_TOUCH_KEY, touch), "rowcount", 0) == 1:
        return
    try:
        with session.begin_nested():
            session.execute(insert(_KEYS), params)
    except IntegrityError:
        session.execute(_TOUCH_KEY, touch)


def write_row(
    session: Session, values: dict[str, Any], *, notify: str | None = None
) -> OutboxReceipt:
    """Insert the row ``values`` (from :func:`row_values`) in the session's transaction, numbered
    under its key's lock when it has a sharding key; on PostgreSQL, ``notify`` names a channel
    the INSERT notifies (:mod:`txmsg.sqla.outbox.notify`; other databases ignore it).

    The commit path of every publishing transaction, so it costs as few statements as the order
    allows: the row's ``seq`` is computed inside its INSERT (``COALESCE(MAX(seq), 0) + 1``; on
    SQLite as the driver's own SQL, :class:`_DriverInsert`), and
    on SQLite the key's lock row is not taken at all: an INSERT holds the database's one write
    lock until the transaction ends and SQLite (WAL) lets a transaction write only from the
    newest snapshot, so the number is taken after every earlier writer of the key committed, in
    whatever BEGIN mode the engine uses.  On other databases the lock row is what orders two
    writers of a key (see the module docstring).  Statements go through the session's connection
    (its transaction), not ``Session.execute``: the ORM's per-statement work is not needed here.
    """
    key = values["sharding_key"]
    connection = session.connection()
    if connection.dialect.name == "sqlite" and connection.dialect.paramstyle == "qmark":
        row_id, seq = _driver_insert(connection.dialect).insert(connection, values)
        values["seq"] = None if seq is None else int(seq)
        return OutboxReceipt(id=row_id, message_key=values["message_key"], seq=values["seq"])
    dialect = connection.dialect.name
    if dialect != "postgresql":
        notify = None
    if key is None:
        if notify is None:
            row_id = connection.execute(_INSERT_ROW, values).scalar_one()
        else:
            notifying = {**values, "notify_channel": notify}
            row_id = connection.execute(_INSERT_ROW_NOTIFY, notifying).one()[0]
        return OutboxReceipt(id=int(row_id), message_key=values["message_key"], seq=None)
    if dialect != "sqlite":
        lock_key(session, values["outbox"], key, values["created_at"])
    if dialect not in ("sqlite", "postgresql"):  # e.g. MySQL: no subquery of the INSERT's table
        last = connection.execute(_MAX_SEQ, {"seq_outbox": values["outbox"], "seq_key": key})
        values["seq"] = int(last.scalar() or 0) + 1
        row_id = connection.execute(_INSERT_ROW, values).scalar_one()
        return OutboxReceipt(id=int(row_id), message_key=values["message_key"], seq=values["seq"])
    params = {k: v for k, v in values.items() if k != "seq"}
    params["seq_outbox"], params["seq_key"] = values["outbox"], key
    if notify is None:
        row_id, seq = connection.execute(_INSERT_KEYED_ROW, params).one()
    else:
        params["notify_channel"] = notify
        row_id, seq, _ = connection.execute(_INSERT_KEYED_ROW_NOTIFY, params).one()
    values["seq"] = int(seq)
    return OutboxReceipt(id=int(row_id), message_key=values["message_key"], seq=int(seq))
