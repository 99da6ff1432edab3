"""The in-flight journal of orderly listeners: a consumer that dies mid-callback loses nothing.

Why: librocketmq 2.1.0's orderly push consumer can commit a queue's offset past a message whose
callback is still running (docs/librocketmq-hazards.md #10).  If the process dies then, the
broker never hands that message again.  So every orderly message is journaled before its
listener runs, until it is consumed or parked.  The journal has two tiers:

* the **spool** (:mod:`txmsg.sqla.spool`): this process appends the message to its own file
  before the listener runs and an end mark after it - two ``write(2)`` calls, no database, no
  ``fsync``.  That is what every message pays.  It survives the death of the process, not of
  the machine, and is read on this host only;
* the **table** ``txmsg_orderly_inflight`` in the service's database (:class:`~txmsg.sqla.models.
  OrderlyInflight`), which every consumer of the group sees.  A message goes there when its
  listener has run longer than ``promote_after`` seconds (so that a consumer on another host can
  finish it if this host never comes back), when it is handed back (the queue may move to
  another consumer before it comes again), and when a dead process's spool is found
  (:meth:`~txmsg.sqla.journal_sweeper.JournalSweeper.import_spools`: by every consumer process
  of the group on the host, at start, at every :meth:`~InflightJournal.refresh` and every
  ``sweep_interval``).  Messages of a
  key that has rows in the table take the table's path, as before the spool existed
  (:meth:`InflightJournal.enter`).

A row left by a consumer that is gone is finished by someone else, in the key's order:

* the consumer that gets the key's next message first handles the key's leftover rows that came
  before it in the queue (:meth:`InflightJournal.enter`), so the key's order holds;
* a sweeper thread in every consumer process picks up leftovers nobody asks for (the key's
  last message was the one in flight), every ``sweep_interval`` seconds.

Which keys have rows is known from a snapshot of the table (:meth:`InflightJournal.refresh`),
taken at most ``refresh_interval`` seconds before a message, and again whenever a queue comes
to this process (see :mod:`txmsg.orderly`).

Who is "gone": the row's owner (``host:pid:token``, host = name and pid namespace) is a process
of this host that no longer exists, or the owner stopped renewing the row's lease (``lease``
seconds; owners renew the rows whose listener is running every ``lease / 3`` seconds).  A lease that ran out while its owner
was merely stalled lets a second consumer handle the same message: with ``idempotent=True`` one
of the two commits and the other is absorbed as a duplicate.  Hosts should keep their clocks in
sync (NTP) to within a small part of the lease.

What this does not cover: the moment between the client taking a message for the callback and
the spool write (Python reading the message: microseconds); a machine crash (records of the
last seconds may not be on disk); a host that never runs the group again, for a message whose
callback was shorter than ``promote_after`` (its spool is read on that host only); and
databases that lose committed rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from txmsg.message import Message
from txmsg.sqla.engine import SessionFactory, bound_engine
from txmsg.sqla.journal_sweeper import JournalSweeper
from txmsg.sqla.journal_table import (
    DELETE,
    EARLIER_BY_ID,
    EARLIER_IN_QUEUE,
    KEYS,
    ROW,
    Leftover,
    begin_read,
    begin_write,
    claim_row,
    insert_returning_id,
)
from txmsg.sqla.liveness import holder_gone, host_identity, new_owner
from txmsg.sqla.models import utcnow
from txmsg.sqla.parking import (
    message_columns,
    parked_message_key,
    sharding_key_of,
    stored_message,
)
from txmsg.sqla.spool import Spool, default_directory, group_directory, live_open_entries

log = logging.getLogger("txmsg.journal")

DEFAULT_LEASE = 30.0
"""Seconds a row stays its owner's without renewal (renewed every third of it while running)."""
DEFAULT_SWEEP_INTERVAL = 2.0
"""Seconds between two looks for leftovers of dead consumers."""
DEFAULT_PROMOTE_AFTER = 0.5
"""Seconds a listener runs before its message is copied from the spool into the table (so that
a consumer on another host can finish it if this host goes away for good)."""
DEFAULT_REFRESH_INTERVAL = 0.5
"""Seconds a snapshot of the keys with rows in the table (and of dead spools) is trusted."""


@dataclass(eq=False)
class Ticket:
    """One message in the journal, from :meth:`InflightJournal.admit` to ``done``/``release``.

    In the spool (``seq``), in the table (``row_id``), or both for a moment while it moves."""

    message: Message
    message_key: str
    seq: int | None = None
    row_id: int | None = None
    started: float = 0.0
    running: bool = True
    moving: bool = False
    """Its row is being written by :meth:`InflightJournal.promote` (outside the lock)."""
    finishing: bool = False
    """The listener's transaction is deleting it (idempotent): not to be moved any more."""
    finished: bool = False
    removed_row: int | None = None
    """The row :meth:`InflightJournal.remove` deleted in the listener's transaction."""


Finish = Callable[[Message, Ticket], bool]
"""How a leftover is handled: ``finish(message, ticket)``; True once its row is gone."""


@dataclass
class Entry:
    """What :meth:`InflightJournal.enter` found for a message."""

    row_id: int | None
    """The message's own row; None when a live consumer is handling this very message."""
    before: list[Leftover] = field(default_factory=list)
    """Rows of the same key and queue, earlier in the queue, to finish first (oldest first)."""
    ticket: Ticket | None = None
    """What :meth:`InflightJournal.admit` hands the handler (None: hand the message again)."""


class InflightJournal:
    """The journal of one consumer group in one process (see the module docstring)."""

    def __init__(
        self,
        session_factory: SessionFactory,
        group: str,
        *,
        lease: float = DEFAULT_LEASE,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
        promote_after: float = DEFAULT_PROMOTE_AFTER,
        spool_directory: Path | None = None,
    ) -> None:
        self.session_factory = session_factory
        self.group = group
        self.lease = timedelta(seconds=lease)
        self.sweep_interval = sweep_interval
        self.promote_after = promote_after
        self.host = host_identity()
        self.owner = new_owner(self.host)
        base = spool_directory or default_directory(bound_engine(session_factory))
        self.spool_directory = group_directory(base, self.host, group)
        """Where this host's spools of the group live (:mod:`txmsg.sqla.spool`)."""
        self._spool: Spool | None = None
        self._running: set[int] = set()
        """Rows a thread of this process is handling now (their leases are renewed)."""
        self._spooled: dict[int, Ticket] = {}
        """Tickets with a spool entry, by ``id()``: what :meth:`promote` looks at."""
        self._released: dict[str, Ticket] = {}
        """Spool tickets handed back (by message key), taken again when the message comes back."""
        self._blocked: frozenset[tuple[str, str]] | None = None
        """(topic, key) with rows in the table, as of the last :meth:`refresh` (None: never)."""
        self._elsewhere: set[tuple[str, str]] = set()
        """Keys whose message a live process of this host had in its listener when their queue
        came here (:meth:`_held_elsewhere`): looked at again at each of their messages."""
        self._added: dict[tuple[str, str], float] = {}
        """Keys this process gave rows since (monotonic time): kept until a refresh sees them."""
        self._lock = threading.Lock()
        #: the background thread: dead consumers' leftovers, leases, long-running messages
        self.sweeper = JournalSweeper(self)
        self.recovered = 0
        """Leftovers of dead consumers this process finished (for stats and tests)."""
        self.imported = 0
        """Messages moved from dead processes' spools into the table (for stats and tests)."""

    # ---- the fast path: the spool --------------------------------------------------------------
    def guard(self, message: Message) -> int:
        """Append ``message`` to this process's spool at once, before anything else is done with
        it; the entry's sequence number, for :meth:`admit` (which keeps it or ends it).

        Why first: librocketmq 2.1.0 may have committed the queue's offset past the message as
        soon as it was taken for this callback (hazard #10).  What runs before the listener -
        reading the parked and journaled keys, a look at the other spools, a table row - reads
        the database, which on a loaded machine takes long enough for a kill to land there:
        without a record yet, the message was lost (two messages of one transfer in CI's
        outbox chaos run of 2026-11-29).  An extra entry that ends moments later costs one
        ``write(2)``; a process killed holding both entries of one message leaves one row."""
        spool = self._spool
        if spool is None:
            with self._lock:
                spool = self._spool = self._spool or Spool(self.spool_directory, self.owner)
        return spool.begin(message)

    def unguard(self, seq: int | None) -> None:
        """End a :meth:`guard` entry that no ticket took (the message has another record now,
        or is handed again later)."""
        if seq is not None and self._spool is not None:
            self._spool.end(seq)

    def admit(
        self,
        message: Message,
        *,
        refresh: bool = False,
        queue_came: bool = False,
        guard: int | None = None,
    ) -> Entry:
        """See :meth:`_admit`; ``guard``: the message's :meth:`guard` entry, which becomes the
        ticket's spool entry, or ends once the message has its other record (or none is
        needed: handed again).  Ended too when this raises."""
        try:
            entry = self._admit(message, refresh=refresh, queue_came=queue_came, guard=guard)
        except BaseException:
            self.unguard(guard)
            raise
        if guard is not None and (entry.ticket is None or entry.ticket.seq != guard):
            self.unguard(guard)
        return entry

    def _admit(
        self, message: Message, *, refresh: bool, queue_came: bool, guard: int | None
    ) -> Entry:
        """Journal ``message`` before its listener runs: in this process's spool when no row of
        its key is in the table, else through the table (:meth:`enter`, which also finds a dead
        consumer's rows to finish first).  ``refresh``: take a new snapshot of the table's keys
        first (a queue just came to this process); one older than ``refresh`` seconds is renewed
        anyway by the caller (:meth:`refresh`).

        ``queue_came``: the message's queue just came to this process (a rebalance).  Then, and
        for as long as it finds one, a live process of the group on this host that has a message
        of the key in its listener makes the entry ticketless (hand the message again later):
        librocketmq 2.1.0 hands a queue over without waiting for the callback running on it
        (hazard #10), and that process's spool entry is not in the table.

        Raises whatever the database or the file system raised (the caller hands the message
        again later)."""
        if refresh or self._blocked is None:
            self.refresh()
        if self._held_elsewhere(message, look=queue_came):
            return Entry(row_id=None)
        message_key = parked_message_key(message)
        with self._lock:
            ticket = self._released.pop(message_key, None)
            if ticket is not None and ticket.row_id is None and not ticket.moving:
                ticket.running, ticket.finishing, ticket.started = True, False, time.monotonic()
                return Entry(row_id=None, ticket=ticket)
            key = (message.topic, sharding_key_of(message))
            blocked = (self._blocked is not None and key in self._blocked) or key in self._added
        if ticket is not None or blocked:
            entry = self.enter(message)
            if entry.row_id is not None:
                entry.ticket = Ticket(message, message_key, row_id=entry.row_id)
            return entry
        spool = self._spool
        if spool is None:
            with self._lock:
                spool = self._spool = self._spool or Spool(self.spool_directory, self.owner)
        ticket = Ticket(message, message_key, started=time.monotonic())
        ticket.seq = guard if guard is not None else spool.begin(message)
        with self._lock:
            self._spooled[id(ticket)] = ticket
        return Entry(row_id=None, ticket=ticket)

    def _held_elsewhere(self, message: Message, *, look: bool) -> bool:
        """Whether another live consumer process of the group on this host is in a listener for
        a message of ``message``'s key (its spool has an open entry of the key).  Looked at when
        ``look`` (the queue just came) and again at every message of a key found held, until it
        is not."""
        key = (message.topic, sharding_key_of(message))
        with self._lock:
            if not look and key not in self._elsewhere:
                return False
        own = self.spool_path
        held = any(
            (m.topic, sharding_key_of(m)) == key
            for m in live_open_entries(self.spool_directory, skip=own)
        )
        with self._lock:
            if held:
                self._elsewhere.add(key)
            else:
                self._elsewhere.discard(key)
        if held:
            log.info(
                "group=%s key=%r: its queue came to this process while another consumer process "
                "still has a message of the key in its listener; waiting for it (hazard #10)",
                self.group,
                key[1],
            )
        return held

    def refresh(self) -> None:
        """Move dead processes' spools into the table, then note which keys have rows there."""
        started = time.monotonic()
        self.sweeper.import_spools()
        with begin_read(self.session_factory) as connection:
            keys = frozenset((r[0], r[1]) for r in connection.execute(KEYS, {"group": self.group}))
        with self._lock:
            self._blocked = keys
            for key in [k for k, at in self._added.items() if at < started]:
                del self._added[key]

    def promote(self, *, everything: bool = False) -> int:
        """Copy into the table the spool entries whose listener has run ``promote_after``
        seconds or that were handed back (``everything``: all of them); their spool entries end.
        Returns how many rows were written."""
        now = time.monotonic()
        with self._lock:
            picked = [
                t
                for t in self._spooled.values()
                if t.seq is not None
                and t.row_id is None
                and not t.moving
                and not t.finishing
                and (everything or not t.running or now - t.started >= self.promote_after)
            ]
            for ticket in picked:
                ticket.moving = True
        if not picked:
            return 0
        rows: dict[int, int] = {}
        conflicts: set[int] = set()
        committed = False
        try:
            lease_until = utcnow() + self.lease
            with begin_write(self.session_factory) as tx:
                for ticket in picked:
                    values = message_columns(self.group, ticket.message) | dict(
                        owner=self.owner, lease_until=lease_until
                    )
                    row_id = insert_returning_id(tx, values)
                    if row_id is None:
                        conflicts.add(id(ticket))
                    else:
                        rows[id(ticket)] = row_id
            committed = True
        finally:
            if not committed:  # nothing was written: every ticket stays in the spool
                rows.clear()
                conflicts.clear()
            finished: list[int] = []
            ended: list[int] = []
            with self._lock:
                for ticket in picked:
                    ticket.moving = False
                    row_id = rows.get(id(ticket))
                    if row_id is None and id(ticket) in conflicts:
                        # The message has a row already (written through the table's path by
                        # a redelivery that raced this move): that row is its record.
                        if ticket.running:
                            ticket.finishing = True  # keep the spool entry; stop moving it
                        else:
                            self._spooled.pop(id(ticket), None)
                            if ticket.seq is not None:
                                ended.append(ticket.seq)
                                ticket.seq = None
                        continue
                    if row_id is None:
                        continue
                    ticket.row_id = row_id
                    self._added[(ticket.message.topic, sharding_key_of(ticket.message))] = now
                    if ticket.finished:
                        finished.append(row_id)
                    elif ticket.running:
                        self._running.add(row_id)
                    else:  # handed back: the row is the message's record now, unrenewed
                        self._released.pop(ticket.message_key, None)
                    self._spooled.pop(id(ticket), None)
                    if ticket.seq is not None:
                        ended.append(ticket.seq)
                        ticket.seq = None
            if self._spool is not None:
                for seq in ended:
                    self._spool.end(seq)
        if finished:  # done while its row was being written: the row goes now
            with begin_write(self.session_factory) as tx:
                for row_id in finished:
                    tx.execute(DELETE, {"row_id": row_id})
        return len(rows)

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
        return holder_gone(owner, lease_until, now, host=self.host)

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
        with begin_write(self.session_factory) as tx:
            row_id = insert_returning_id(tx, values)
            if row_id is None:  # handed again: the row is there from an earlier delivery
                row = tx.execute(ROW, {"group": self.group, "message_key": message_key}).one()
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
                earlier = tx.execute(EARLIER_IN_QUEUE, params)
            else:
                earlier = tx.execute(EARLIER_BY_ID, params)
            before = [
                Leftover(
                    id=r.id, owner=r.owner, lease_until=r.lease_until, message=stored_message(r)
                )
                for r in earlier
            ]
        return Entry(row_id=row_id, before=before)

    def claim(self, leftover: Leftover, why: str = "before the key's next message") -> bool:
        """Make a dead consumer's row this process's; False if its owner lives or another
        consumer claimed it first (then hand the current message again later).  ``why`` goes
        into the log line."""
        now = utcnow()
        if not self.is_dead(leftover.owner, leftover.lease_until, leftover.id, now):
            return False
        with begin_write(self.session_factory) as tx:
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
        """Make the row this process's for a lease from ``now`` (:func:`claim_row`)."""
        return claim_row(
            tx, (row_id, owner, lease_until), self.owner, now + self.lease, self.group, why
        )

    def leftover_ticket(self, leftover: Leftover) -> Ticket:
        """The ticket of a leftover this process has :meth:`claim`-ed."""
        message = leftover.message
        return Ticket(message, parked_message_key(message), row_id=leftover.id)

    def remove(self, session: Session | Connection, ticket: Ticket) -> None:
        """Inside the listener's transaction (``idempotent=True``): delete the message's row
        with its effects, if it has one; either way it is not moved into the table any more."""
        with self._lock:
            ticket.finishing = True
            row_id = None if ticket.moving else ticket.row_id
            ticket.removed_row = row_id
        if row_id is not None:
            session.execute(DELETE, {"row_id": row_id})

    def done(self, ticket: Ticket, *, removed: bool = False) -> None:
        """The message was consumed or parked: end its spool entry, delete its row (unless
        ``removed`` with the listener's effects already)."""
        with self._lock:
            ticket.finished, ticket.running = True, False
            self._spooled.pop(id(ticket), None)
            row_id, moving = ticket.row_id, ticket.moving
            seq, ticket.seq = ticket.seq, None
            if row_id is not None:
                self._running.discard(row_id)
        if row_id is not None and not moving and not (removed and ticket.removed_row == row_id):
            with begin_write(self.session_factory) as tx:
                tx.execute(DELETE, {"row_id": row_id})
        if seq is not None and self._spool is not None:
            self._spool.end(seq)

    def hold(self, ticket: Ticket) -> None:
        """The message is acknowledged and waits for a batch write elsewhere (a message parked
        behind its key: :mod:`txmsg.orderly`), shortly: its spool entry is not moved into the
        table (a row would make the key's next messages take the table's path and wait for it)
        and ends with :meth:`done`.  An entry being moved right now keeps its row."""
        with self._lock:
            if ticket.row_id is None and not ticket.moving:
                ticket.finishing = True

    def release(self, ticket: Ticket) -> None:
        """The message is handed again later: keep its record, stop renewing it.  A spool
        entry goes into the table now (the queue may move to a consumer on another host before
        the message comes back); if the database does not answer, the sweeper tries again."""
        with self._lock:
            ticket.running, ticket.finishing = False, False
            if ticket.row_id is not None:
                self._running.discard(ticket.row_id)
            spooled = ticket.row_id is None and ticket.seq is not None
            if spooled:
                self._released[ticket.message_key] = ticket
        if spooled:
            try:
                self.promote()
            except Exception:  # the database is down (often why it was handed back)
                log.debug(
                    "group=%s: could not move a handed-back message", self.group, exc_info=True
                )

    # ---- the sweeper ---------------------------------------------------------------------------
    def start(self, finish: Finish) -> None:
        """Start the sweeper (:class:`~txmsg.sqla.journal_sweeper.JournalSweeper`): dead
        consumers' spools go into the table first, then a thread renews leases, moves
        long-running messages into the table and finishes dead consumers' leftovers."""
        self.sweeper.start(finish)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the sweeper; messages handed back and never taken again go into the table (or,
        if the database does not answer, stay in the spool file for the host's next consumer)."""
        self.sweeper.stop(timeout)
        try:
            self.promote(everything=True)
        except Exception:
            log.warning(
                "group=%s: could not move the spool's open entries into the journal table; "
                "the host's next consumer of the group will",
                self.group,
                exc_info=True,
            )
        if self._spool is not None:
            self._spool.close()

    def sweep(self, finish: Finish) -> int:
        """Finish leftovers of dead consumers now (:meth:`JournalSweeper.sweep`)."""
        return self.sweeper.sweep(finish)

    def running_rows(self) -> list[int]:
        """The rows a thread of this process is handling now (their leases are renewed)."""
        with self._lock:
            return sorted(self._running)

    @property
    def spool_path(self) -> Path | None:
        """This process's spool file, once it has one."""
        return self._spool.path if self._spool is not None else None
