"""Parked sharding keys of orderly consumers: park, list, replay, discard.

An orderly listener (``@message_listener(..., orderly=True)``) that keeps failing on a message
parks the message's *sharding key* here instead of blocking its queue forever
(:mod:`txmsg.orderly`): the message goes to ``txmsg_parked_message``, the key to
``txmsg_parked_key``, and every later message of that key the group receives is parked behind it,
in the order the queue delivered them.  Once the cause is fixed, :func:`replay` hands the parked
messages to the same listener handler in that order and releases the key.

The locking protocol (why nothing is lost or reordered while the consumer and a replay run at
the same time):

* the consumer parks a message *behind* a key in ONE transaction that first reads the key row
  ``FOR UPDATE`` and inserts the message only if the key row exists;
* replay releases a key in ONE transaction that reads the key row ``FOR UPDATE``, counts the
  key's parked messages and deletes the key row only if there are none.

So either the consumer's message is in the table before replay counts (replay then handles it
too), or the key is gone before the consumer looks (the consumer then handles the message
itself, after everything replay handled).  PostgreSQL gets the row lock from ``FOR UPDATE``;
SQLite has no row locks, but txmsg's engines begin every writing transaction with
``BEGIN IMMEDIATE`` (:mod:`txmsg.sqla.engine`), which serialises the two transactions as a whole.

Run one replay of a key at a time: two replays of the same key could both hand a message to the
listener before either deletes its row (harmless with ``idempotent=True``, which is exactly-once
either way).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    Select,
    Table,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from txmsg.message import DEDUP_KEY, SHARDING_KEY, UNIQ_KEY, Message
from txmsg.sqla.engine import SessionFactory, bound_engine, read_only
from txmsg.sqla.idempotent import IdempotentConsumer
from txmsg.sqla.models import OrderlyInflight, ParkedKey, ParkedMessage, utcnow
from txmsg.sqla.quick_select import QuickSelect
from txmsg.sqla.views import message_of, view_of

if TYPE_CHECKING:
    from txmsg.consumer import ConsumerSpec

log = logging.getLogger("txmsg.parking")

MAX_ERROR_CHARS = 4000
"""Errors are stored cut to this length (a message of a runaway exception can be huge)."""


def sharding_key_of(message: Message) -> str:
    """The key a message is parked under: its sharding key; ``""`` for messages sent without one
    (they all share that one key, so one failing message without a key parks all of them)."""
    return message.sharding_key or message.properties.get(SHARDING_KEY) or ""


def parked_message_key(message: Message) -> str:
    """What makes a parked message unique in its group: ``DEDUP_KEY`` (an outbox row's stable key),
    else ``UNIQ_KEY`` (the same on every copy of a message), else the message id, else its queue position; a random key when nothing identifies
    it (then a redelivery after a crash could be parked twice)."""
    key = (
        message.properties.get(DEDUP_KEY) or message.properties.get(UNIQ_KEY) or message.message_id
    )
    if key:
        return key
    if message.queue_id is not None and message.queue_offset is not None:
        return f"{message.topic}@{message.queue_id}:{message.queue_offset}"
    return f"anon-{uuid.uuid4().hex}"


def message_columns(group: str, message: Message) -> dict[str, Any]:
    """The :class:`~txmsg.sqla.models.StoredMessage` columns of ``message`` kept for ``group``."""
    return dict(
        consumer_group=group,
        sharding_key=sharding_key_of(message),
        topic=message.topic,
        message_key=parked_message_key(message),
        message_id=message.message_id,
        tags=message.tags,
        keys=message.keys,
        properties=dict(message.properties),
        body=message.body,
        reconsume_times=message.reconsume_times,
        queue_id=message.queue_id,
        queue_offset=message.queue_offset,
    )


def stored_message(row: Any) -> Message:
    """The message a :class:`~txmsg.sqla.models.StoredMessage` row keeps (an ORM object or a Core
    row: the same attribute names), as the listener first got it."""
    return message_of(
        row,
        message_id=row.message_id,
        reconsume_times=row.reconsume_times,
        sharding_key=row.sharding_key or None,
        queue_id=row.queue_id,
        queue_offset=row.queue_offset,
    )


def _error_text(error: str) -> str:
    return error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 3] + "..."


@dataclass(frozen=True)
class ParkedKeyView:
    """A parked key as :func:`parked_keys` reports it."""

    group: str
    sharding_key: str
    topic: str
    reason: str
    first_message_id: str | None
    parked_at: datetime
    messages: int
    """Messages parked under the key (the failed one and those behind it)."""


@dataclass(frozen=True)
class ParkedMessageView:
    """A parked message as :func:`parked_messages` reports it; :attr:`message` is what replay
    hands to the listener."""

    id: int
    group: str
    sharding_key: str
    message_key: str
    error: str | None
    attempts: int
    parked_at: datetime
    message: Message


@dataclass
class KeyReplay:
    """What :func:`replay` did with one key."""

    group: str
    sharding_key: str
    replayed: int = 0
    """Messages the listener handled (including duplicates an idempotent listener absorbed)."""
    unparked: bool = False
    """True when the key was released: the consumer handles its messages live again."""
    failed_message_key: str | None = None
    error: str | None = None
    """Why the key is still parked (the listener's error on ``failed_message_key``)."""


@dataclass
class ReplayReport:
    """What :func:`replay` did, per key, in the order it went through them."""

    keys: list[KeyReplay] = field(default_factory=list)

    @property
    def replayed(self) -> int:
        return sum(k.replayed for k in self.keys)

    @property
    def failed(self) -> list[KeyReplay]:
        """Keys that stay parked because a message failed again."""
        return [k for k in self.keys if k.error is not None]

    @property
    def ok(self) -> bool:
        return not self.failed


# ---- the consumer side ---------------------------------------------------------------------------
_IS_PARKED = QuickSelect(
    select(ParkedKey.sharding_key).where(
        ParkedKey.consumer_group == bindparam("group"), ParkedKey.sharding_key == bindparam("key")
    )
)
"""Built once: the check runs before every message of an orderly listener."""


def is_parked(session_factory: SessionFactory, group: str, key: str) -> bool:
    """Whether ``group`` has parked ``key`` (a non-locking read: the cheap check before every
    message of an orderly listener; how it stays cheap: :mod:`txmsg.sqla.quick_select`)."""
    return bool(_IS_PARKED.values(session_factory, group=group, key=key))


_PARKED_KEYS = QuickSelect(
    select(ParkedKey.sharding_key).where(ParkedKey.consumer_group == bindparam("group"))
)


def parked_key_set(session_factory: SessionFactory, group: str) -> frozenset[str]:
    """Every key ``group`` has parked now (one non-locking SELECT, like :func:`is_parked`)."""
    return frozenset(str(key) for key in _PARKED_KEYS.values(session_factory, group=group))


class ParkedKeyCache:
    """The parked keys of one group, in memory: the orderly handler's "is this key parked?"
    without a query per message.

    Why it may: the answer only decides which path a message takes.  "Parked" leads to
    :func:`park_behind`, whose transaction reads the key row again under its lock and answers
    False when the key is not parked (any more: a replay released it), so a stale "parked" costs
    one transaction and is corrected (:meth:`discard`).  A stale "not parked" would let a message
    overtake its key's parked ones, so the set is read again whenever the handler's snapshot is
    older than its refresh interval or a queue comes to the process (:mod:`txmsg.orderly`), and
    this process's own parks go in at once (:meth:`add`)."""

    def __init__(self, session_factory: SessionFactory, group: str) -> None:
        self.session_factory = session_factory
        self.group = group
        self._keys: frozenset[str] | None = None
        self._added: set[str] = set()
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read the group's parked keys (raises what the database raised)."""
        with self._lock:
            added = set(self._added)
        keys = parked_key_set(self.session_factory, self.group)
        with self._lock:
            self._keys = keys
            self._added -= added  # parked before the read: in it (or replayed since)

    def __contains__(self, key: object) -> bool:
        if self._keys is None:
            self.refresh()
        keys = self._keys
        return (keys is not None and key in keys) or key in self._added

    def add(self, key: str) -> None:
        with self._lock:
            self._added.add(key)

    def discard(self, key: str) -> None:
        """:func:`park_behind` found ``key`` released: forget it until a refresh says otherwise."""
        with self._lock:
            self._added.discard(key)
            if self._keys is not None and key in self._keys:
                self._keys = self._keys - {key}


_LOCK_KEY = (
    select(ParkedKey.sharding_key)
    .where(
        ParkedKey.consumer_group == bindparam("group"), ParkedKey.sharding_key == bindparam("key")
    )
    .with_for_update()
)
"""The key row, locked (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers)."""


def _lock_key(session: Session, group: str, key: str) -> ParkedKey | None:
    return session.scalars(
        select(ParkedKey)
        .where(ParkedKey.consumer_group == group, ParkedKey.sharding_key == key)
        .with_for_update()
    ).one_or_none()


_INSERT_ONCE: dict[tuple[type[Any], str], Any] = {}
"""``INSERT ... ON CONFLICT DO NOTHING`` per (table, dialect), built once and run with parameters:
building the statement with its values for every message cost more than running it."""


def _insert_once(
    session: Session | Connection,
    model: type[ParkedKey] | type[ParkedMessage] | type[OrderlyInflight],
    values: dict[str, Any],
) -> bool:
    """Insert a row of ``model``; False when a unique key says the row is there already.

    Parking races with redeliveries and with other consumer threads of the same key, and the
    loser of that race must keep its transaction (the key's row lock, the rest of the park)
    rather than have it rolled back by an IntegrityError.  PostgreSQL and SQLite say "already
    there" without an error (``INSERT ... ON CONFLICT DO NOTHING``); other databases get the
    insert in a savepoint.  Park-behind runs for every message of a parked key, so this is on
    the consumer's path (``benchmarks/orderly_throughput.py`` prints its cost).
    """
    dialect = (
        session.dialect.name if isinstance(session, Connection) else session.get_bind().dialect.name
    )
    if dialect in ("postgresql", "sqlite"):
        statement = _INSERT_ONCE.get((model, dialect))
        if statement is None:
            dialect_insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
            # The answer is whether a row came back, not the rowcount: psycopg reports -1 for
            # this statement on PostgreSQL, and an ORM-enabled insert through a Session did on
            # SQLite too (measured: every first insert looked like "already there").
            table: Table = model.__table__  # type: ignore[assignment]  # declared a Table
            statement = _INSERT_ONCE[(model, dialect)] = (
                dialect_insert(table).on_conflict_do_nothing().returning(*table.primary_key)
            )
        return session.execute(statement, values).first() is not None
    try:
        with session.begin_nested():
            session.execute(insert(model), values)
    except IntegrityError:
        return False
    return True


def _insert_message(
    session: Session | Connection,
    group: str,
    key: str,
    message: Message,
    *,
    error: str | None,
    attempts: int,
    now: datetime,
) -> bool:
    """Insert ``message`` behind ``key``; False when it is already parked (a redelivery)."""
    return _insert_once(
        session,
        ParkedMessage,
        message_columns(group, message)
        | dict(
            sharding_key=key,
            error=None if error is None else _error_text(error),
            attempts=attempts,
            parked_at=now,
        ),
    )


def park_behind(session_factory: SessionFactory, group: str, message: Message) -> bool:
    """Park ``message`` behind its key if ``group`` has parked the key; False if the key is not
    parked (any more), in which case the caller handles the message itself.

    A message that is already parked (handed again after a crash) counts as parked: True.
    """
    key = sharding_key_of(message)
    engine = bound_engine(session_factory)
    if engine is not None:
        # Every message of a parked key comes here: a Core transaction on the engine skips the
        # ORM session (about half the cost on SQLite); same statements, same locking.
        with engine.begin() as connection:
            if connection.execute(_LOCK_KEY, {"group": group, "key": key}).first() is None:
                return False
            _insert_message(connection, group, key, message, error=None, attempts=0, now=utcnow())
            return True
    with session_factory() as session, session.begin():
        if _lock_key(session, group, key) is None:
            return False
        _insert_message(session, group, key, message, error=None, attempts=0, now=utcnow())
        return True


def park_behind_many(
    session_factory: SessionFactory, group: str, messages: Sequence[Message]
) -> list[bool]:
    """:func:`park_behind` for several messages in ONE transaction: per message, whether it is
    parked now (True, also when it was parked already) or its key is not parked (any more).

    Why: an orderly handler with the in-flight journal acknowledges a message of a parked key
    once the journal holds it and writes such messages here in batches (:mod:`txmsg.orderly`),
    one commit instead of one per message.  The locking protocol is :func:`park_behind`'s: each
    key's row is read ``FOR UPDATE`` once, before its messages go in, in the given order.
    """
    if not messages:
        return []
    engine = bound_engine(session_factory)
    if engine is not None:
        with engine.begin() as connection:
            return _park_behind_all(connection, group, messages)
    with session_factory() as session, session.begin():
        return _park_behind_all(session, group, messages)


def _park_behind_all(
    tx: Session | Connection, group: str, messages: Sequence[Message]
) -> list[bool]:
    keys = {key: True for key in map(sharding_key_of, messages)}
    for key in keys:
        keys[key] = tx.execute(_LOCK_KEY, {"group": group, "key": key}).first() is not None
    now = utcnow()
    for message in messages:
        key = sharding_key_of(message)
        if keys[key]:
            _insert_message(tx, group, key, message, error=None, attempts=0, now=now)
    return [keys[sharding_key_of(message)] for message in messages]


def park(
    session_factory: SessionFactory,
    group: str,
    message: Message,
    *,
    error: str,
    attempts: int,
) -> datetime:
    """Park ``message``'s key for ``group`` with the message as its first one (one transaction);
    returns when the key was parked.

    If the key is parked already (a concurrent consumer of the ``""`` key, or a redelivery),
    the message is parked behind it instead, at most once.
    """
    key = sharding_key_of(message)
    now = utcnow()
    with session_factory() as session, session.begin():
        existing = _lock_key(session, group, key)
        if existing is None and not _insert_once(
            session,
            ParkedKey,
            dict(
                consumer_group=group,
                sharding_key=key,
                topic=message.topic,
                reason=_error_text(error),
                first_message_id=message.message_id,
                parked_at=now,
            ),
        ):
            existing = _lock_key(session, group, key)  # parked meanwhile by another thread
        _insert_message(session, group, key, message, error=error, attempts=attempts, now=now)
        return existing.parked_at if existing is not None else now


# ---- reading -------------------------------------------------------------------------------------
def parked_key_count(session_factory: SessionFactory, group: str) -> int:
    """How many keys ``group`` has parked (one COUNT; the ``txmsg.parked_keys`` gauge)."""
    query = select(func.count()).select_from(ParkedKey).where(ParkedKey.consumer_group == group)
    with session_factory() as session, session.begin():
        read_only(session)
        return int(session.execute(query).scalar_one())


def parked_keys(session_factory: SessionFactory, group: str | None = None) -> list[ParkedKeyView]:
    """Parked keys (of ``group``, or of every group), oldest first, with their message counts."""
    counts = (
        select(
            ParkedMessage.consumer_group,
            ParkedMessage.sharding_key,
            func.count().label("n"),
        )
        .group_by(ParkedMessage.consumer_group, ParkedMessage.sharding_key)
        .subquery()
    )
    query = (
        select(ParkedKey, func.coalesce(counts.c.n, 0))
        .outerjoin(
            counts,
            (counts.c.consumer_group == ParkedKey.consumer_group)
            & (counts.c.sharding_key == ParkedKey.sharding_key),
        )
        .order_by(ParkedKey.parked_at, ParkedKey.consumer_group, ParkedKey.sharding_key)
    )
    if group is not None:
        query = query.where(ParkedKey.consumer_group == group)
    with session_factory() as session, session.begin():
        read_only(session)
        return [
            view_of(ParkedKeyView, row, group=row.consumer_group, messages=int(n))
            for row, n in session.execute(query).all()
        ]


def _view(row: ParkedMessage) -> ParkedMessageView:
    return view_of(ParkedMessageView, row, group=row.consumer_group, message=stored_message(row))


def _in_order(group: str, key: str) -> Select[ParkedMessage]:
    """The messages parked under ``key`` for ``group`` in their original order: what the
    listing and the replay both read, so both see the same order."""
    return (
        select(ParkedMessage)
        .where(ParkedMessage.consumer_group == group, ParkedMessage.sharding_key == key)
        .order_by(ParkedMessage.id)
    )


def parked_messages(
    session_factory: SessionFactory, group: str, key: str
) -> list[ParkedMessageView]:
    """The messages parked under ``key`` for ``group``, in their original order."""
    with session_factory() as session, session.begin():
        read_only(session)
        return [_view(row) for row in session.scalars(_in_order(group, key)).all()]


def _first_message(
    session_factory: SessionFactory, group: str, key: str
) -> ParkedMessageView | None:
    with session_factory() as session, session.begin():
        read_only(session)
        row = session.scalars(_in_order(group, key).limit(1)).one_or_none()
        return None if row is None else _view(row)


# ---- replay and discard --------------------------------------------------------------------------
def _unpark_if_empty(session: Session, group: str, key: str) -> bool:
    """The releasing half of the protocol; True when the key row is gone (deleted now or already)."""
    if _lock_key(session, group, key) is None:
        return True
    left = session.scalar(
        select(func.count())
        .select_from(ParkedMessage)
        .where(ParkedMessage.consumer_group == group, ParkedMessage.sharding_key == key)
    )
    if left:
        return False
    session.execute(
        delete(ParkedKey).where(ParkedKey.consumer_group == group, ParkedKey.sharding_key == key)
    )
    return True


def _delete_row(session: Session, row_id: int) -> None:
    session.execute(delete(ParkedMessage).where(ParkedMessage.id == row_id))


def _replay_key(
    handler: Callable[[Message], Any], session_factory: SessionFactory, group: str, key: str
) -> KeyReplay:
    done = KeyReplay(group=group, sharding_key=key)
    while True:
        parked = _first_message(session_factory, group, key)
        if parked is None:
            with session_factory() as session, session.begin():
                if _unpark_if_empty(session, group, key):
                    done.unparked = True
                    log.info("group=%s key=%r: replayed %d, unparked", group, key, done.replayed)
                    return done
            continue  # the consumer parked another message meanwhile: replay it too
        try:
            if isinstance(handler, IdempotentConsumer):
                # effects, dedup row and the parked row's removal commit together: exactly once
                applied = handler.apply(
                    parked.message, in_same_transaction=partial(_delete_row, row_id=parked.id)
                )
                if not applied:  # applied before (e.g. by an earlier replay): just drop the row
                    with session_factory() as session, session.begin():
                        _delete_row(session, parked.id)
            else:
                handler(parked.message)
                # at least once: a crash between the handler and this delete replays it again
                with session_factory() as session, session.begin():
                    _delete_row(session, parked.id)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.error(
                "group=%s key=%r msgId=%s: replay failed (%s); the key stays parked",
                group,
                key,
                parked.message.message_id,
                error,
                exc_info=True,
            )
            _record_failure(session_factory, group, key, parked.id, error)
            done.failed_message_key, done.error = parked.message_key, error
            return done
        done.replayed += 1


def _record_failure(
    session_factory: SessionFactory, group: str, key: str, row_id: int, error: str
) -> None:
    text = _error_text(error)
    with session_factory() as session, session.begin():
        session.execute(
            update(ParkedMessage)
            .where(ParkedMessage.id == row_id)
            .values(error=text, attempts=ParkedMessage.attempts + 1)
        )
        session.execute(
            update(ParkedKey)
            .where(ParkedKey.consumer_group == group, ParkedKey.sharding_key == key)
            .values(reason=text)
        )


def replay(
    spec_or_handler: ConsumerSpec | Callable[[Message], Any],
    session_factory: SessionFactory,
    group: str,
    key: str | None = None,
) -> ReplayReport:
    """Hand the parked messages of ``group`` (only ``key``'s, if given) to the listener again,
    key by key (oldest parked first), each key's messages in their original order.

    ``spec_or_handler``: the listener's :class:`~txmsg.consumer.ConsumerSpec` (its ``handler``
    runs, the one live consumption runs: with ``idempotent=True`` the idempotent wrapper, and
    then each message's effects and the removal of its parked row commit in one transaction, so
    the replay is exactly-once) or any ``handler(message)``.  Without ``idempotent=True`` a
    crash between a message's handler and its row's removal replays that message again
    (at-least-once).

    A message that fails again stops its key: the key stays parked, the error and attempt count
    are recorded, and replay goes on with the next key.  A key whose messages are all handled is
    released (messages the live consumer parks behind it meanwhile are replayed too).
    """
    from txmsg.consumer import ConsumerSpec  # noqa: PLC0415 - consumer imports this lazily

    handler: Callable[[Message], Any] = (
        spec_or_handler.handler if isinstance(spec_or_handler, ConsumerSpec) else spec_or_handler
    )
    if key is None:
        keys = [view.sharding_key for view in parked_keys(session_factory, group)]
    else:
        keys = [key]
    report = ReplayReport()
    from txmsg.aio.callables import is_async  # noqa: PLC0415 - tiny; consumer imports us lazily

    bridge = None
    if is_async(handler):
        # an `async def` listener: replayed on an event loop of the replay's own, one for all
        # its messages (the CLI has none; a coroutine calling replay() runs it in a thread)
        from txmsg.aio.loop import LoopBridge  # noqa: PLC0415
        from txmsg.consumer import bridged  # noqa: PLC0415

        bridge = LoopBridge.on_own_thread("txmsg-replay-loop")
        handler = bridged(handler, bridge, f"{getattr(handler, '__qualname__', handler)}")
    try:
        for each in keys:
            report.keys.append(_replay_key(handler, session_factory, group, each))
    finally:
        if bridge is not None:
            bridge.close()
    return report


def discard(
    session_factory: SessionFactory, group: str, key: str, message_key: str | None = None
) -> int:
    """Delete parked messages of ``key`` for ``group`` without handling them: all of them, or only
    the one whose message key (``UNIQ_KEY``/message id) is ``message_key``.  Returns how many
    were deleted.  A key left without messages is released (same protocol as replay)."""
    with session_factory() as session, session.begin():
        if _lock_key(session, group, key) is None:
            return 0
        query = delete(ParkedMessage).where(
            ParkedMessage.consumer_group == group, ParkedMessage.sharding_key == key
        )
        if message_key is not None:
            query = query.where(ParkedMessage.message_key == message_key)
        deleted = int(getattr(session.execute(query), "rowcount", 0) or 0)
        _unpark_if_empty(session, group, key)
    log.warning(
        "group=%s key=%r: discarded %d parked message(s)%s",
        group,
        key,
        deleted,
        "" if message_key is None else f" (message {message_key})",
    )
    return deleted
