"""The in-flight journal of orderly listeners: a consumer that dies mid-callback loses nothing.

Why: librocketmq 2.1.0's orderly push consumer can commit a queue's offset past a message whose
callback is still running (docs/librocketmq-hazards.md #10).  If the process dies then, the
broker never hands that message again.  So, before an orderly listener runs, txmsg writes the
message to ``txmsg_orderly_inflight`` in the service's database (:class:`~txmsg.sqla.models.
OrderlyInflight`) and deletes the row once the message is consumed or parked.  A row left by a
consumer that is gone is finished by someone else, in the key's order:

* the consumer that gets the key's next message first handles the key's leftover rows that came
  before it in the queue (:meth:`InflightJournal.enter`), so the key's order holds;
* a sweeper thread in every consumer process picks up leftovers nobody asks for (the key's
  last message was the one in flight), every ``sweep_interval`` seconds.

Who is "gone": the row's owner (``host:pid:token``, host = name and pid namespace) is a process
of this host that no longer exists, or the owner stopped renewing the row's lease (``lease``
seconds; owners renew the rows whose listener is running every ``lease / 3`` seconds).  A lease that ran out while its owner
was merely stalled lets a second consumer handle the same message: with ``idempotent=True`` one
of the two commits and the other is absorbed as a duplicate.  Hosts should keep their clocks in
sync (NTP) to within a small part of the lease.

What this does not cover: the moment between the client taking a message for the callback and
the row's commit (the time of one INSERT), and databases that lose committed rows.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Table, and_, bindparam, delete, or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from txmsg.message import Message
from txmsg.sqla.engine import SessionFactory, read_only
from txmsg.sqla.models import OrderlyInflight, utcnow
from txmsg.sqla.parking import (
    _insert_once,
    message_columns,
    sharding_key_of,
    stored_message,
)

log = logging.getLogger("txmsg.journal")

DEFAULT_LEASE = 30.0
"""Seconds a row stays its owner's without renewal (renewed every third of it while running)."""
DEFAULT_SWEEP_INTERVAL = 2.0
"""Seconds between two looks for leftovers of dead consumers."""

Finish = Callable[[Message, int], bool]
"""How a leftover is handled: ``finish(message, row_id)``; True once the row is gone."""


@dataclass(frozen=True)
class Leftover:
    """A journal row another consumer left behind, and the message it holds."""

    id: int
    owner: str
    lease_until: datetime
    message: Message


@dataclass
class Entry:
    """What :meth:`InflightJournal.enter` found for a message."""

    row_id: int | None
    """The message's own row; None when a live consumer is handling this very message."""
    before: list[Leftover] = field(default_factory=list)
    """Rows of the same key and queue, earlier in the queue, to finish first (oldest first)."""


def host_identity() -> str:
    """This process's "host" for the liveness check: the host name plus, on Linux, the pid
    namespace.  Why the namespace: containers that share the host's name (host networking) but
    not its pids would otherwise take each other's live consumers for dead ones."""
    name = socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return name
    digits = "".join(ch for ch in namespace if ch.isdigit())
    return f"{name}#{digits}" if digits else name


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's process: alive
        return True
    return True


_TABLE: Table = OrderlyInflight.__table__  # type: ignore[assignment]  # declared a Table
_T = _TABLE.c
# Built once: every orderly message runs them (building a statement cost more than running it).
_ROW = select(_T.id, _T.owner, _T.lease_until).where(
    _T.consumer_group == bindparam("group"), _T.message_key == bindparam("message_key")
)
_EARLIER = select(_TABLE).where(
    _T.consumer_group == bindparam("group"),
    _T.sharding_key == bindparam("key"),
    _T.topic == bindparam("topic"),
    _T.id != bindparam("row_id"),
)
_EARLIER_IN_QUEUE = _EARLIER.where(
    or_(
        and_(_T.queue_id == bindparam("queue_id"), _T.queue_offset < bindparam("queue_offset")),
        # the key on another queue: the topic's queue count changed while its consumer was dead
        # (the key hashes to a new queue now); that row was written first, so it comes first
        and_(_T.queue_id != bindparam("queue_id"), _T.id < bindparam("row_id")),
    )
).order_by(_T.id)
_EARLIER_BY_ID = _EARLIER.where(_T.id < bindparam("row_id")).order_by(_T.id)
_CLAIM = (
    update(_TABLE)
    .where(
        _T.id == bindparam("row_id"),
        _T.owner == bindparam("old_owner"),
        _T.lease_until == bindparam("old_lease"),
    )
    .values(owner=bindparam("new_owner"), lease_until=bindparam("new_lease"))
)
_DELETE = delete(_TABLE).where(_T.id == bindparam("row_id"))
_INSERT_RETURNING: dict[str, Any] = {}


def _insert_returning_id(tx: Connection | Session, values: dict[str, Any]) -> int | None:
    """Insert the row; its id, or None when the message's row is there already (a redelivery).
    PostgreSQL and SQLite do it in one statement (``ON CONFLICT DO NOTHING RETURNING id``)."""
    dialect = tx.dialect.name if isinstance(tx, Connection) else tx.get_bind().dialect.name
    if dialect in ("postgresql", "sqlite"):
        statement = _INSERT_RETURNING.get(dialect)
        if statement is None:
            dialect_insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
            statement = _INSERT_RETURNING[dialect] = (
                dialect_insert(_TABLE).on_conflict_do_nothing().returning(_T.id)
            )
        row_id = tx.execute(statement, values).scalar()
        return None if row_id is None else int(row_id)
    if not _insert_once(tx, OrderlyInflight, values):
        return None
    found = tx.execute(
        _ROW, {"group": values["consumer_group"], "message_key": values["message_key"]}
    ).one()
    return int(found.id)


class InflightJournal:
    """The journal of one consumer group in one process (see the module docstring)."""

    def __init__(
        self,
        session_factory: SessionFactory,
        group: str,
        *,
        lease: float = DEFAULT_LEASE,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
    ) -> None:
        self.session_factory = session_factory
        self.group = group
        self.lease = timedelta(seconds=lease)
        self.sweep_interval = sweep_interval
        self.host = host_identity()
        self.owner = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._running: set[int] = set()
        """Rows a thread of this process is handling now (their leases are renewed)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.recovered = 0
        """Leftovers of dead consumers this process finished (for stats and tests)."""

    # ---- liveness -------------------------------------------------------------------------------
    def is_dead(self, owner: str, lease_until: datetime, row_id: int, now: datetime) -> bool:
        """Whether the row's owner is gone: nobody may be handling it any more."""
        if owner == self.owner:
            # One of this process's rows that no thread handles: its message was handed back
            # (the listener answered False); the queue hands it to us again soon, so it is
            # anybody's only once its lease ran out (the queue moved to another consumer).
            with self._lock:
                if row_id in self._running:
                    return False
            return lease_until < now
        if lease_until < now:
            return True
        host, _, rest = owner.partition(":")
        pid = rest.partition(":")[0]
        return host == self.host and pid.isdigit() and not _pid_alive(int(pid))

    # ---- the consumer's path --------------------------------------------------------------------
    def enter(self, message: Message) -> Entry:
        """Write ``message``'s row (or take it back after a redelivery) and find the rows of its
        key and queue that a dead consumer left earlier in the queue.  One transaction.

        The row is this process's until :meth:`done` or :meth:`release`; its lease is renewed
        meanwhile.  ``row_id`` None: a live consumer (another process, or this process's
        sweeper) is handling this message right now; hand it again later.
        """
        now = utcnow()
        values = message_columns(self.group, message) | dict(
            owner=self.owner, lease_until=now + self.lease
        )
        key, message_key = values["sharding_key"], values["message_key"]
        with self._begin() as tx:
            row_id = _insert_returning_id(tx, values)
            if row_id is None:  # handed again: the row is there from an earlier delivery
                row = tx.execute(_ROW, {"group": self.group, "message_key": message_key}).one()
                row_id = row.id
                if row.owner != self.owner and not self.is_dead(
                    row.owner, row.lease_until, row.id, now
                ):
                    return Entry(row_id=None)
                # take it (or, if it is ours, renew its lease): one of two claimants wins
                if not self._claim(tx, row.id, row.owner, row.lease_until, now, "handed again"):
                    return Entry(row_id=None)
            with self._lock:
                if row_id in self._running:
                    return Entry(row_id=None)  # this process's sweeper has it
                self._running.add(row_id)
            params: dict[str, object] = {
                "group": self.group,
                "key": key,
                "topic": message.topic,
                "row_id": row_id,
            }
            if message.queue_id is not None and message.queue_offset is not None:
                # a row later in the queue is handed again by the broker after this one
                params.update(queue_id=message.queue_id, queue_offset=message.queue_offset)
                earlier = tx.execute(_EARLIER_IN_QUEUE, params)
            else:
                earlier = tx.execute(_EARLIER_BY_ID, params)
            before = [
                Leftover(
                    id=r.id, owner=r.owner, lease_until=r.lease_until, message=stored_message(r)
                )
                for r in earlier
            ]
        return Entry(row_id=row_id, before=before)

    @contextmanager
    def _begin(self) -> Iterator[Connection | Session]:
        """One write transaction: a Core connection when the factory is a ``sessionmaker`` bound
        to an engine (every orderly message pays this, and the ORM session cost more than the
        statements), else a session."""
        bind = getattr(self.session_factory, "kw", {}).get("bind")
        if isinstance(bind, Engine):
            with bind.begin() as connection:
                yield connection
            return
        with self.session_factory() as session, session.begin():
            yield session

    def claim(self, leftover: Leftover, why: str = "before the key's next message") -> bool:
        """Make a dead consumer's row this process's; False if its owner lives or another
        consumer claimed it first (then hand the current message again later).  ``why`` goes
        into the log line."""
        now = utcnow()
        if not self.is_dead(leftover.owner, leftover.lease_until, leftover.id, now):
            return False
        with self._begin() as tx:
            if not self._claim(tx, leftover.id, leftover.owner, leftover.lease_until, now, why):
                return False
        with self._lock:
            if leftover.id in self._running:
                return False
            self._running.add(leftover.id)
        return True

    def _claim(
        self,
        tx: Connection | Session,
        row_id: int,
        owner: str,
        lease_until: datetime,
        now: datetime,
        why: str,
    ) -> bool:
        # Compare-and-set on (owner, lease): of two consumers claiming one row, one wins.
        result = tx.execute(
            _CLAIM,
            {
                "row_id": row_id,
                "old_owner": owner,
                "old_lease": lease_until,
                "new_owner": self.owner,
                "new_lease": now + self.lease,
            },
        )
        claimed = getattr(result, "rowcount", 0) == 1
        if claimed and owner != self.owner:
            log.warning(
                "group=%s: finishing row %d left by consumer %s (gone), %s; see "
                "docs/librocketmq-hazards.md #10",
                self.group,
                row_id,
                owner,
                why,
            )
        return claimed

    def remove(self, session: Session | Connection, row_id: int) -> None:
        """Delete the row inside the caller's transaction (with the listener's effects)."""
        session.execute(_DELETE, {"row_id": row_id})

    def done(self, row_id: int, *, removed: bool = False) -> None:
        """The message was consumed or parked: delete its row (unless ``removed`` already)."""
        if not removed:
            with self._begin() as tx:
                self.remove(tx, row_id)
        with self._lock:
            self._running.discard(row_id)

    def release(self, row_id: int) -> None:
        """The message is handed again later: keep the row, stop renewing it."""
        with self._lock:
            self._running.discard(row_id)

    # ---- leases and the sweeper -----------------------------------------------------------------
    def start(self, finish: Finish) -> None:
        """Start the thread that renews leases and finishes dead consumers' leftovers."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, args=(finish,), name=f"txmsg-journal-{self.group}", daemon=True
        )
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, finish: Finish) -> None:
        renew_every = self.lease.total_seconds() / 3
        renewed = 0.0
        elapsed = renew_every  # renew (and sweep) at once
        while not self._stop.is_set():
            try:
                if elapsed - renewed >= renew_every:
                    self.renew()
                    renewed = elapsed
                self.sweep(finish)
            except Exception:  # the database may be down: try again next round
                log.warning(
                    "group=%s: journal sweep failed; trying again", self.group, exc_info=True
                )
            self._stop.wait(self.sweep_interval)
            elapsed += self.sweep_interval

    def renew(self) -> None:
        """Extend the leases of the rows this process is handling."""
        with self._lock:
            running = sorted(self._running)
        if not running:
            return
        with self.session_factory() as session, session.begin():
            session.execute(
                update(OrderlyInflight)
                .where(OrderlyInflight.id.in_(running), OrderlyInflight.owner == self.owner)
                .values(lease_until=utcnow() + self.lease)
            )

    def rows(self, limit: int = 100) -> list[tuple[Leftover, bool]]:
        """This group's rows, oldest first, each with whether its owner is gone."""
        with self.session_factory() as session, session.begin():
            read_only(session)
            rows = session.scalars(
                select(OrderlyInflight)
                .where(OrderlyInflight.consumer_group == self.group)
                .order_by(OrderlyInflight.id)
                .limit(limit)
            ).all()
            now = utcnow()
            return [
                (
                    Leftover(
                        id=r.id, owner=r.owner, lease_until=r.lease_until, message=stored_message(r)
                    ),
                    self.is_dead(r.owner, r.lease_until, r.id, now),
                )
                for r in rows
            ]

    def sweep(self, finish: Finish) -> int:
        """Finish leftovers of dead consumers, each key's in order; returns how many.

        A key with an earlier row that somebody is still handling (a live owner) waits: its
        later leftovers come after that one, in a later sweep."""
        blocked: set[tuple[str, str]] = set()
        finished = 0
        for leftover, dead in self.rows():
            key = (leftover.message.topic, sharding_key_of(leftover.message))
            if self._stop.is_set():
                break
            if not dead or key in blocked or not self.claim(leftover, "by the sweeper"):
                blocked.add(key)  # a later row of the key must wait for this one
                continue
            if finish(leftover.message, leftover.id):
                finished += 1
                self.recovered += 1
            else:
                blocked.add(key)
        return finished
