"""The outbox's queries for the relay and the operator: due rows, marks, leases, views, retry,
discard, figures.

Statements are built once (the relay runs them every cycle).  Every function takes a session
factory or a session and never holds a transaction longer than its own statements, except
:func:`due_chains` with ``lock=True``, whose row locks the relay keeps while it sends (see
:mod:`txmsg.sqla.outbox.relay`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Delete,
    String,
    Table,
    Update,
    and_,
    bindparam,
    delete,
    exists,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session, aliased

from txmsg.message import Message
from txmsg.sqla.engine import SessionFactory, read_only
from txmsg.sqla.models import utcnow
from txmsg.sqla.outbox.models import OutboxKey, OutboxMessage, OutboxRelayLease, OutboxState
from txmsg.sqla.views import message_of, view_of

MAX_ERROR_CHARS = 4000
"""Errors are stored cut to this length."""

_MESSAGES: Table = OutboxMessage.__table__  # type: ignore[assignment]  # declared a Table
_M = _MESSAGES.c
_EARLIER = aliased(OutboxMessage, name="earlier")

PENDING = OutboxState.PENDING.value
DEAD = OutboxState.DEAD.value


def error_text(error: str) -> str:
    """``error`` cut to :data:`MAX_ERROR_CHARS`."""
    return error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 3] + "..."


# ---- the relay's rows ---------------------------------------------------------------------------
_NO_EARLIER_ROW = ~exists().where(
    _EARLIER.outbox == OutboxMessage.outbox,
    _EARLIER.sharding_key == OutboxMessage.sharding_key,
    _EARLIER.seq < OutboxMessage.seq,
)
"""A row of a key is sendable only when no row of that key with a smaller ``seq`` is left
(pending, in back-off or dead): sent rows are deleted, so this is "everything before it went"."""

_DUE = (
    select(OutboxMessage)
    .where(
        OutboxMessage.outbox == bindparam("outbox"),
        OutboxMessage.state == PENDING,
        OutboxMessage.next_attempt_at <= bindparam("now"),
        or_(OutboxMessage.sharding_key.is_(None), _NO_EARLIER_ROW),
    )
    .order_by(OutboxMessage.next_attempt_at, OutboxMessage.id)
    .limit(bindparam("limit"))
)
_SEND_COLUMNS = (
    _M.id,
    _M.message_key,
    _M.topic,
    _M.tags,
    _M["keys"],  # not _M.keys: the collection's keys() method
    _M.properties,
    _M.body,
    _M.sharding_key,
    _M.delay_level,
    _M.deliver_at_ms,
    _M.attempts,
)
_DUE_SEND = _DUE.with_only_columns(*_SEND_COLUMNS)
_DUE_SEND_LOCKED = _DUE_SEND.with_for_update(skip_locked=True, of=_MESSAGES)


def _sent_keys() -> Any:
    """``SELECT value FROM json_each(:sent)``: the ``message_key`` list of a SQLite relay's
    :class:`~txmsg.sqla.outbox.ledger.SentLedger`, as one JSON parameter (any length; SQLite
    materialises it once per statement)."""
    return select(
        func.json_each(bindparam("sent", type_=String())).table_valued("value").c.value
    ).scalar_subquery()


_DUE_SEND_UNSENT = (
    select(*_SEND_COLUMNS)
    .where(
        _M.outbox == bindparam("outbox"),
        _M.state == PENDING,
        _M.next_attempt_at <= bindparam("now"),
        _M.message_key.not_in(_sent_keys()),
        or_(
            _M.sharding_key.is_(None),
            ~exists().where(
                _EARLIER.outbox == _M.outbox,
                _EARLIER.sharding_key == _M.sharding_key,
                _EARLIER.seq < _M.seq,
                _EARLIER.message_key.not_in(_sent_keys()),
            ),
        ),
    )
    .order_by(_M.next_attempt_at, _M.id)
    .limit(bindparam("limit"))
)
"""SQLite: :data:`_DUE_SEND` as if the rows of ``:sent`` (sent, deletion pending) were gone."""


def due_to_send(
    session: Session, outbox: str, *, limit: int, lock: bool, now: datetime | None = None
) -> list[Any]:
    """Up to ``limit`` rows to send now: rows without a key, and the first row of each key, whose
    time has come; oldest due first.  At most one row per sharding key.  Only the columns a send
    needs, as plain row mappings (the relay reads them every cycle, in the writers' process:
    no ORM objects).

    ``lock``: ``FOR UPDATE SKIP LOCKED`` (PostgreSQL): rows another relay is sending are skipped,
    and so is the rest of their key (a key's next row is not first while the locked one is
    there), so relays share the rows without breaking a key's order.
    """
    statement = _DUE_SEND_LOCKED if lock else _DUE_SEND
    params = {"outbox": outbox, "now": now or utcnow(), "limit": limit}
    return list(session.connection().execute(statement, params).mappings().all())


_RANK = func.row_number().over(partition_by=_M.sharding_key, order_by=_M.seq).label("rank_in_key")
_KEYS_ROWS = (
    select(*_SEND_COLUMNS, _M.seq, _M.state, _M.next_attempt_at, _RANK)
    .where(_M.outbox == bindparam("outbox"), _M.sharding_key.in_(bindparam("keys", expanding=True)))
    .subquery()
)
_FOLLOWING = (
    select(_KEYS_ROWS)
    .where(_KEYS_ROWS.c.rank_in_key <= bindparam("per_key"))
    .order_by(_KEYS_ROWS.c.sharding_key, _KEYS_ROWS.c.seq)
)
_KEYS_UNSENT_ROWS = (
    select(*_SEND_COLUMNS, _M.seq, _M.state, _M.next_attempt_at, _RANK)
    .where(
        _M.outbox == bindparam("outbox"),
        _M.sharding_key.in_(bindparam("keys", expanding=True)),
        _M.message_key.not_in(_sent_keys()),
    )
    .subquery()
)
_FOLLOWING_UNSENT = (
    select(_KEYS_UNSENT_ROWS)
    .where(_KEYS_UNSENT_ROWS.c.rank_in_key <= bindparam("per_key"))
    .order_by(_KEYS_UNSENT_ROWS.c.sharding_key, _KEYS_UNSENT_ROWS.c.seq)
)


def due_chains(
    session: Session,
    outbox: str,
    *,
    limit: int,
    per_key: int,
    lock: bool,
    now: datetime | None = None,
    sent: Sequence[str] | None = None,
) -> list[list[Any]]:
    """What a relay cycle sends: :func:`due_to_send`'s rows, each keyed one followed by up to
    ``per_key - 1`` next rows of its key (in ``seq`` order, as long as they are pending and due),
    as lists the relay sends one after the other, each once the broker acknowledged the one
    before.  Why: with one row of a key per cycle (two transactions and a broker round trip), a
    busy key would be held to the cycle rate however fast the broker answers.

    Only the first row of each key is locked (``lock``, PostgreSQL): while it is there no other
    relay sees the key's next rows as due, so they are this relay's too until it commits.

    ``sent`` (SQLite, not with ``lock``): message keys of rows this relay sent whose deletion has
    not committed yet (:mod:`txmsg.sqla.outbox.ledger`): read as if they were gone.
    """
    now = now or utcnow()
    connection = session.connection()
    if sent is None:
        first = due_to_send(session, outbox, limit=limit, lock=lock, now=now)
        following, extra = _FOLLOWING, {}
    else:
        extra = {"sent": json.dumps(list(sent))}
        params = {"outbox": outbox, "now": now, "limit": limit, **extra}
        first = list(connection.execute(_DUE_SEND_UNSENT, params).mappings().all())
        following = _FOLLOWING_UNSENT
    chains = [[row] for row in first]
    by_key = {c[0]["sharding_key"]: c for c in chains if c[0]["sharding_key"] is not None}
    if per_key <= 1 or not by_key:
        return chains
    params = {"outbox": outbox, "keys": list(by_key), "per_key": per_key, **extra}
    closed: set[str] = set()
    for row in connection.execute(following, params).mappings():
        key = row["sharding_key"]
        chain = by_key[key]
        if key in closed or row["id"] == chain[0]["id"]:
            continue
        if row["state"] != PENDING or row["next_attempt_at"] > now:
            closed.add(key)  # a dead row or one in back-off: the rest of the key waits behind it
            continue
        chain.append(row)
    return chains


_DELETE_SENT = delete(_MESSAGES).where(_M.id.in_(bindparam("row_ids", expanding=True)))
_DELETE_SENT_KEYS = delete(_MESSAGES).where(
    _M.outbox == bindparam("outbox"),
    _M.message_key.in_(
        select(func.json_each(bindparam("sent", type_=String())).table_valued("value").c.value)
    ),
)
_RETRY_LATER = (
    update(_MESSAGES)
    .where(_M.id == bindparam("row_id"))
    .values(
        attempts=bindparam("attempts"),
        next_attempt_at=bindparam("next_at"),
        last_error=bindparam("error"),
    )
)
_BURY = (
    update(_MESSAGES)
    .where(_M.id == bindparam("row_id"))
    .values(
        state=DEAD,
        attempts=bindparam("attempts"),
        last_error=bindparam("error"),
        dead_at=bindparam("now"),
    )
)


def delete_sent(session: Session, row_ids: Sequence[int]) -> None:
    """The rows reached the broker: they go (their copies carry their stable key); one
    statement for the whole cycle, so the SQLite write lock is held as briefly as possible."""
    if row_ids:
        session.connection().execute(_DELETE_SENT, {"row_ids": list(row_ids)})


def delete_sent_keys(connection: Connection, outbox: str, message_keys: Sequence[str]) -> int:
    """SQLite: delete the sent rows of ``message_keys`` in the connection's transaction (a
    writer's, or the relay's own), one statement; returns how many rows it deleted."""
    if not message_keys:
        return 0
    params = {"outbox": outbox, "sent": json.dumps(list(message_keys))}
    return int(connection.execute(_DELETE_SENT_KEYS, params).rowcount or 0)


def retry_later(
    session: Session, row_id: int, *, attempts: int, next_at: datetime, error: str
) -> None:
    """Record a failed attempt; the row is due again at ``next_at``."""
    session.connection().execute(
        _RETRY_LATER,
        {"row_id": row_id, "attempts": attempts, "next_at": next_at, "error": error_text(error)},
    )


def bury(session: Session, row_id: int, *, attempts: int, error: str, now: datetime) -> None:
    """Mark the row dead: no more attempts until an operator retries it."""
    session.connection().execute(
        _BURY, {"row_id": row_id, "attempts": attempts, "error": error_text(error), "now": now}
    )


# ---- the SQLite relay lease ---------------------------------------------------------------------
@dataclass(frozen=True)
class Lease:
    """Who relays an outbox (SQLite)."""

    owner: str
    lease_until: datetime
    since: datetime


def read_lease(session_factory: SessionFactory, outbox: str) -> Lease | None:
    """The outbox's relay lease row, if any."""
    with session_factory() as session, session.begin():
        read_only(session)
        row = session.get(OutboxRelayLease, outbox)
        return None if row is None else Lease(row.owner, row.lease_until, row.since)


def take_lease(
    session_factory: SessionFactory,
    outbox: str,
    owner: str,
    *,
    lease: timedelta,
    is_dead: Any,
) -> tuple[bool, Lease | None]:
    """Take or renew the lease of ``outbox`` for ``owner`` in one write transaction.

    Returns (held, the previous holder when it was someone else).  ``is_dead(owner, until, now)``
    says whether another holder is gone (then the lease is taken over at once)."""
    now = utcnow()
    with session_factory() as session, session.begin():
        row = session.get(OutboxRelayLease, outbox)
        if row is None:
            session.add(
                OutboxRelayLease(outbox=outbox, owner=owner, lease_until=now + lease, since=now)
            )
            return True, None
        previous = Lease(row.owner, row.lease_until, row.since)
        if row.owner == owner:
            row.lease_until = now + lease
            return True, None
        if not is_dead(row.owner, row.lease_until, now):
            return False, previous
        row.owner, row.lease_until, row.since = owner, now + lease, now
        return True, previous


def release_lease(session_factory: SessionFactory, outbox: str, owner: str) -> None:
    """Give the lease up (a standby relay takes over at its next look)."""
    with session_factory() as session, session.begin():
        session.execute(
            delete(OutboxRelayLease).where(
                OutboxRelayLease.outbox == outbox, OutboxRelayLease.owner == owner
            )
        )


# ---- figures ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backlog:
    """What an outbox holds: the figures of ``stats()``, ``txmsg outbox status`` and the doctor."""

    group: str
    unsent: int
    """Rows not sent yet (due, in back-off, or waiting behind an earlier row of their key)."""
    oldest_unsent_at: datetime | None
    dead: int

    def oldest_unsent_age(self, now: datetime | None = None) -> float | None:
        """Seconds since the oldest unsent row was written (None when nothing is unsent)."""
        if self.oldest_unsent_at is None:
            return None
        return max(0.0, ((now or utcnow()) - self.oldest_unsent_at).total_seconds())


def backlogs(
    session_factory: SessionFactory, outbox: str | None = None, *, sent: Sequence[str] = ()
) -> list[Backlog]:
    """The backlog of ``outbox`` (or of every outbox with rows), by group.  ``sent`` (SQLite):
    message keys of rows a relay of this process sent whose deletion is pending, not counted
    (:mod:`txmsg.sqla.outbox.ledger`)."""
    query = select(
        OutboxMessage.outbox,
        OutboxMessage.state,
        func.count(),
        func.min(OutboxMessage.created_at),
    ).group_by(OutboxMessage.outbox, OutboxMessage.state)
    if outbox is not None:
        query = query.where(OutboxMessage.outbox == outbox)
    params: dict[str, Any] = {}
    if sent:
        query = query.where(OutboxMessage.message_key.not_in(_sent_keys()))
        params["sent"] = json.dumps(list(sent))
    with session_factory() as session, session.begin():
        read_only(session)
        found = session.execute(query, params).all()
    groups: dict[str, dict[str, Any]] = {}
    if outbox is not None:
        groups[outbox] = {}
    for group, state, count, oldest in found:
        groups.setdefault(group, {})[state] = (int(count), oldest)
    out: list[Backlog] = []
    for group, states in sorted(groups.items()):
        unsent, oldest = states.get(PENDING, (0, None))
        dead, _ = states.get(DEAD, (0, None))
        # MIN() of a UtcDateTime column comes back without the type on some dialects
        if isinstance(oldest, str):
            oldest = datetime.fromisoformat(oldest)
        if isinstance(oldest, datetime) and oldest.tzinfo is None:
            oldest = oldest.replace(tzinfo=utcnow().tzinfo)
        out.append(Backlog(group=group, unsent=unsent, oldest_unsent_at=oldest, dead=dead))
    return out


# ---- views for operators ------------------------------------------------------------------------
@dataclass(frozen=True)
class OutboxRowView:
    """An unsent or dead row as :func:`rows` lists it; :attr:`message` is what the relay sends
    (without the stable key property it adds)."""

    id: int
    group: str
    message_key: str
    sharding_key: str | None
    seq: int | None
    state: str
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    created_at: datetime
    dead_at: datetime | None
    delay_level: int | None
    deliver_at_ms: int | None
    message: Message


def view(row: OutboxMessage) -> OutboxRowView:
    """The operator's view of a row."""
    return view_of(
        OutboxRowView,
        row,
        group=row.outbox,
        message=message_of(row, sharding_key=row.sharding_key),
    )


def _filters(
    outbox: str | None,
    state: str | None,
    sharding_key: str | None,
    ids: Sequence[int] | None,
) -> list[Any]:
    where: list[Any] = []
    if outbox is not None:
        where.append(OutboxMessage.outbox == outbox)
    if state is not None:
        where.append(OutboxMessage.state == state)
    if sharding_key is not None:
        where.append(OutboxMessage.sharding_key == sharding_key)
    if ids is not None:
        where.append(OutboxMessage.id.in_(list(ids)))
    return where


def rows(
    session_factory: SessionFactory,
    outbox: str | None = None,
    *,
    state: str | None = None,
    sharding_key: str | None = None,
    ids: Sequence[int] | None = None,
    limit: int = 100,
) -> list[OutboxRowView]:
    """Rows still in the outbox (unsent or dead), by group, key and ``seq`` (a key's rows in the
    order the relay sends them), then id."""
    query = (
        select(OutboxMessage)
        .where(*_filters(outbox, state, sharding_key, ids))
        .order_by(
            OutboxMessage.outbox, OutboxMessage.sharding_key, OutboxMessage.seq, OutboxMessage.id
        )
        .limit(limit)
    )
    with session_factory() as session, session.begin():
        read_only(session)
        return [view(row) for row in session.scalars(query).all()]


def retry_dead(
    session_factory: SessionFactory,
    outbox: str | None = None,
    *,
    sharding_key: str | None = None,
    ids: Sequence[int] | None = None,
) -> list[int]:
    """Make dead rows pending again with fresh attempts (due now); returns their ids.

    Their last error stays until the next attempt; a key's rows go again in their order.  A
    relay sends them at its next cycle (at most its poll interval later).
    """
    return _on_dead(
        session_factory,
        _filters(outbox, DEAD, sharding_key, ids),
        lambda: update(OutboxMessage).values(
            state=PENDING, attempts=0, next_attempt_at=utcnow(), dead_at=None
        ),
    )


def discard_dead(
    session_factory: SessionFactory,
    outbox: str | None = None,
    *,
    sharding_key: str | None = None,
    ids: Sequence[int] | None = None,
) -> list[int]:
    """Delete dead rows without sending them; returns their ids.  Only dead rows: an unsent row
    may be in a relay's hands right now.  Their key's later rows flow again."""
    return _on_dead(
        session_factory, _filters(outbox, DEAD, sharding_key, ids), lambda: delete(OutboxMessage)
    )


def _on_dead(
    session_factory: SessionFactory,
    where: list[Any],
    statement: Callable[[], Update | Delete],
) -> list[int]:
    """The ids of the dead rows ``where`` picks, after ``statement()`` ran on them in the same
    transaction.  The statement is kept to rows still dead: a row a relay made pending meanwhile
    is in its hands, and neither a retry nor a discard may touch it."""
    with session_factory() as session, session.begin():
        found = [int(i) for i in session.scalars(select(OutboxMessage.id).where(*where)).all()]
        if found:
            session.execute(
                statement()
                .where(OutboxMessage.id.in_(found), OutboxMessage.state == DEAD)
                .execution_options(synchronize_session=False)
            )
        return found


def purge_idle_keys(
    session_factory: SessionFactory, outbox: str, *, idle_for: timedelta, batch: int = 1000
) -> int:
    """Delete lock rows of keys without rows, not used for ``idle_for``; returns how many.

    Safe at any time: a key's lock row only serialises its writers, and numbering starts from the
    rows still there (:mod:`txmsg.sqla.outbox.writer`).  Without this, ``txmsg_outbox_key`` keeps
    one row per sharding key ever written.
    """
    cutoff = utcnow() - idle_for
    idle = (
        select(OutboxKey.sharding_key)
        .where(
            OutboxKey.outbox == outbox,
            OutboxKey.used_at < cutoff,
            ~exists().where(
                and_(
                    OutboxMessage.outbox == OutboxKey.outbox,
                    OutboxMessage.sharding_key == OutboxKey.sharding_key,
                )
            ),
        )
        .limit(batch)
    )
    with session_factory() as session, session.begin():
        keys = list(session.scalars(idle).all())
        if not keys:
            return 0
        result = session.execute(
            delete(OutboxKey)
            .where(
                OutboxKey.outbox == outbox,
                OutboxKey.sharding_key.in_(keys),
                OutboxKey.used_at < cutoff,
            )
            .execution_options(synchronize_session=False)
        )
        return int(getattr(result, "rowcount", 0) or 0)
