"""How a relay claims an outbox's rows, so that no two relays send a row at once: one small
strategy per kind of database, under the relay's one cycle (:class:`txmsg.sqla.outbox.Relay`).

* :class:`LockedRows` (PostgreSQL, and any database with row locks): every relay sends.  A
  cycle takes its first rows ``FOR UPDATE SKIP LOCKED`` and keeps them locked while it sends,
  in the transaction that deletes them; a killed relay's locks go with its connection.
* :class:`LeasedRows` (SQLite: no row locks, one writer at a time): one relay per outbox and
  database sends, holding a lease row; the others stand by.  A cycle reads in a transaction that
  takes no lock and never holds the write lock while the broker answers; the rows it sent are
  deleted by the next writer's transaction (:mod:`txmsg.sqla.outbox.ledger`) or by the relay.

A strategy gets the cycle's steps from the relay (read the due rows, send them, write the
marks) and decides only where the transactions begin and end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from txmsg.message import SendResult
from txmsg.sqla.engine import read_only
from txmsg.sqla.liveness import holder_gone
from txmsg.sqla.outbox import store
from txmsg.sqla.outbox.ledger import SentLedger

if TYPE_CHECKING:
    from txmsg.sqla.outbox.outbox import Outbox
    from txmsg.sqla.outbox.relay import OutboxDeadEvent

log = logging.getLogger("txmsg.outbox")

DELETES_MARK = "txmsg_outbox_deletes"
"""``session.info`` key: the ledger claims whose deletion the session's commit completes."""
SELF_DELETE_AFTER = 0.5
"""SQLite: seconds a sent row waits for a writer's transaction to delete it (see
:mod:`txmsg.sqla.outbox.ledger`) before the relay deletes it itself: a busy service deletes
its relay's rows at no cost, a quiet one (or the relay's own process) a moment later.  Not
shorter: a writer stalled for a moment (a checkpoint's fsync, a loaded machine) would meet the
relay's delete transaction holding the write lock, and sleep in SQLite's busy handler."""
SELF_DELETE_AT = 1024
"""SQLite: sent rows waiting for deletion at which the relay deletes them itself at once (its
reads pass their keys along)."""


@dataclass(frozen=True)
class Row:
    """What a cycle needs of a row, read in its transaction."""

    id: int
    message_key: str
    topic: str
    tags: str | None
    keys: str | None
    properties: dict[str, str]
    body: bytes
    sharding_key: str | None
    delay_level: int | None
    deliver_at_ms: int | None
    attempts: int

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Row:
        """From a row of :func:`store.due_to_send` (a mapping of its columns)."""
        return cls(
            id=row["id"],
            message_key=row["message_key"],
            topic=row["topic"],
            tags=row["tags"],
            keys=row["keys"],
            properties=dict(row["properties"] or {}),
            body=row["body"],
            sharding_key=row["sharding_key"],
            delay_level=row["delay_level"],
            deliver_at_ms=row["deliver_at_ms"],
            attempts=row["attempts"],
        )


@dataclass
class Outcome:
    """A row's send in a cycle."""

    row: Row
    result: SendResult | None = None
    error: BaseException | None = None
    skipped: bool = False
    """Not sent because the producer is closing: the row stays as it was."""


@dataclass
class Marks:
    """What a cycle wrote, acted on once it committed."""

    sent: int = 0
    retry: list[tuple[int, float]] = field(default_factory=list)
    """(row id, seconds of back-off)."""
    dead: list[OutboxDeadEvent] = field(default_factory=list)
    failed: int = 0
    errors: list[str] = field(default_factory=list)


Due = Callable[[Session, int, bool, "list[str] | None"], list[list[Row]]]
"""``due(session, limit, lock, sent)``: the chains a cycle sends (``store.due_chains``)."""
Send = Callable[[list[list[Row]]], list[Outcome]]
Mark = Callable[[Session, list[Outcome], bool], Marks]
"""``mark(session, outcomes, delete)``: delete the sent rows (when ``delete``), record the
failures, in the session's transaction."""


class Claims(Protocol):
    """What the relay's cycle asks of its database's strategy."""

    ledger: SentLedger | None
    """SQLite, while the relay's thread runs: its sent rows whose deletion is pending."""

    def ready(self) -> bool:
        """Whether this relay may send now (SQLite: it holds the lease, taken or renewed when
        due); False: stand by."""
        ...

    def cycle(
        self, limit: int, due: Due, send: Send, mark: Mark, *, deferred: bool
    ) -> tuple[list[list[Row]], Marks | None]:
        """One cycle's transactions: the chains taken (none: nothing due) and the marks."""
        ...

    def tidy(self, *, everything: bool = False) -> None:
        """After a cycle of the relay's thread (and at its close, ``everything``)."""
        ...

    def wait(self, timeout: float) -> float:
        """``timeout`` shortened to when :meth:`tidy` has work."""
        ...

    def delete_sent_in(self, session: Session) -> None:
        """In a writer's transaction that has just written an outbox row (:meth:`Outbox.send`)."""
        ...

    def sent_not_deleted(self) -> list[str]: ...

    def start(self) -> None:
        """The relay's thread starts."""
        ...

    def release(self) -> None:
        """Give up what :meth:`ready` took (the relay closes, or a drain ends)."""
        ...

    def drain_refused(self) -> str | None:
        """Why this relay may not drain now (None: it may)."""
        ...


class LockedRows:
    """PostgreSQL: rows locked ``FOR UPDATE SKIP LOCKED`` while they are sent (module doc)."""

    ledger: SentLedger | None = None

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    def ready(self) -> bool:
        return True  # every relay sends: the row locks share the rows out

    def cycle(
        self, limit: int, due: Due, send: Send, mark: Mark, *, deferred: bool
    ) -> tuple[list[list[Row]], Marks | None]:
        with self.outbox.session_factory() as session, session.begin():
            chains = due(session, limit, True, None)
            if not chains:
                return chains, None
            return chains, mark(session, send(chains), True)

    def tidy(self, *, everything: bool = False) -> None:
        pass  # the cycle's transaction deleted the sent rows

    def wait(self, timeout: float) -> float:
        return timeout

    def delete_sent_in(self, session: Session) -> None:
        pass

    def sent_not_deleted(self) -> list[str]:
        return []

    def start(self) -> None:
        pass

    def release(self) -> None:
        pass

    def drain_refused(self) -> str | None:
        return None


class LeasedRows:
    """SQLite: one relay holds the outbox's lease; its sent rows are deleted later (module
    doc)."""

    def __init__(self, outbox: Outbox, engine: Engine, *, owner: str, host: str) -> None:
        self.outbox = outbox
        self.engine = engine
        self.owner = owner
        self.host = host
        self.ledger: SentLedger | None = None
        self.holder: str | None = None
        """Who holds the lease while this relay stands by."""
        self.standing_by = False
        self.renewed = -1.0e18
        """When this relay last took or renewed the lease (monotonic seconds)."""

    def start(self) -> None:
        self.ledger = SentLedger()

    # ---- the lease ------------------------------------------------------------------------------
    def ready(self) -> bool:
        """Take or renew the lease when due; False while another relay holds it."""
        now = time.monotonic()
        if not self.standing_by and now - self.renewed < self.outbox.lease / 3:
            return True
        held, previous = store.take_lease(
            self.outbox.session_factory,
            self.outbox.group,
            self.owner,
            lease=timedelta(seconds=self.outbox.lease),
            is_dead=self._holder_gone,
        )
        if not held:
            if not self.standing_by or (previous and previous.owner != self.holder):
                self.holder = previous.owner if previous else None
                log.warning(
                    "outbox=%s: another relay (%s) sends this outbox's rows in this SQLite "
                    "database; this one stands by and takes over when it stops",
                    self.outbox.group,
                    self.holder,
                )
            self.standing_by = True
            return False
        if previous is not None:
            log.warning(
                "outbox=%s: relay %s took over from %s (gone)",
                self.outbox.group,
                self.owner,
                previous.owner,
            )
        self.renewed = now
        self.standing_by = False
        return True

    def _holder_gone(self, owner: str, lease_until: datetime, now: datetime) -> bool:
        return holder_gone(owner, lease_until, now, host=self.host)

    def release(self) -> None:
        store.release_lease(self.outbox.session_factory, self.outbox.group, self.owner)
        self.renewed = -1.0e18

    def drain_refused(self) -> str | None:
        if self.ready():
            return None
        return (
            f"outbox {self.outbox.group!r}: another relay ({self.holder}) sends this outbox's "
            "rows in this SQLite database; stop it first, or let it do the work"
        )

    # ---- the cycle ------------------------------------------------------------------------------
    def cycle(
        self, limit: int, due: Due, send: Send, mark: Mark, *, deferred: bool
    ) -> tuple[list[list[Row]], Marks | None]:
        """``deferred`` (the relay's thread): the sent rows go to the ledger instead of being
        deleted here, and only failures are written."""
        factory = self.outbox.session_factory
        ledger = self.ledger if deferred else None
        # the keys before the read: a deletion that commits meanwhile is not seen by it
        sent = ledger.keys() if ledger is not None else None
        with factory() as session, session.begin():
            read_only(session)
            chains = due(session, limit, False, sent)
        if not chains:
            return chains, None
        outcomes = send(chains)
        if ledger is None:
            with factory() as session, session.begin():
                return chains, mark(session, outcomes, True)
        ledger.add(o.row.message_key for o in outcomes if o.result is not None)
        if any(o.error is not None for o in outcomes):
            with factory() as session, session.begin():
                marks = mark(session, outcomes, False)
        else:
            marks = Marks()
        marks.sent = sum(1 for o in outcomes if o.result is not None)
        return chains, marks

    # ---- deleting sent rows ---------------------------------------------------------------------
    def wait(self, timeout: float) -> float:
        oldest = self.ledger.oldest_free() if self.ledger is not None else None
        if oldest is None:
            return timeout
        return min(timeout, max(0.0, oldest + SELF_DELETE_AFTER - time.monotonic()))

    def sent_not_deleted(self) -> list[str]:
        return self.ledger.keys() if self.ledger is not None else []

    def delete_sent_in(self, session: Session) -> None:
        """Delete this relay's sent rows in ``session``'s transaction, which has just written an
        outbox row and so holds SQLite's write lock (see :mod:`txmsg.sqla.outbox.ledger`).  The
        deletion counts once the session commits.

        Nothing happens unless the relay's thread runs, the session writes to the relay's own
        engine, and outside a savepoint (a savepoint rolled back while its transaction commits
        would leave rows the relay thinks deleted: they would be sent again, harmless but
        avoidable)."""
        ledger = self.ledger
        if ledger is None or not ledger.has_free() or session.in_nested_transaction():
            return
        connection = session.connection()
        if connection.engine is not self.engine:
            return
        try:
            claimed = self._delete_claimed(ledger, connection)
        except SQLAlchemyError:
            # never the writer's problem: SQLite undoes the failed statement only, the
            # transaction goes on, and the relay deletes the rows itself later
            log.debug("outbox=%s: a writer could not delete sent rows", self.outbox.group)
            return
        if claimed is None:
            return
        token, complete = claimed
        if not complete:
            # not all there (deleted meanwhile?): the relay deletes what is left in its own
            ledger.release(token)
            return
        session.info.setdefault(DELETES_MARK, []).append((ledger, token))

    def _delete_claimed(
        self, ledger: SentLedger, connection: Connection
    ) -> tuple[int, bool] | None:
        """Claim the ledger's free entries and delete their rows on ``connection``: (the claim's
        token, whether every row was there), or None when nothing is free.  A failed delete
        hands the claim back."""
        claim = ledger.claim()
        if claim is None:
            return None
        token, keys = claim
        try:
            deleted = store.delete_sent_keys(connection, self.outbox.group, keys)
        except BaseException:
            ledger.release(token)
            raise
        return token, deleted == len(keys)

    def tidy(self, *, everything: bool = False) -> None:
        """Delete sent rows no writer deleted within :data:`SELF_DELETE_AFTER` (or, with
        ``everything``, the relay closing, all that no writer's open transaction is deleting:
        waiting for those could wait for this very thread's own open transaction) in a
        transaction of the relay's own."""
        ledger = self.ledger
        if ledger is None:
            return
        oldest = ledger.oldest_free()
        if oldest is None:
            return
        young = time.monotonic() - oldest < SELF_DELETE_AFTER
        if not everything and young and len(ledger) < SELF_DELETE_AT:
            return
        claimed = None
        try:
            with self.outbox.session_factory() as session, session.begin():
                claimed = self._delete_claimed(ledger, session.connection())
        except BaseException:
            if claimed is not None:  # deleted, but the commit failed
                ledger.release(claimed[0])
            raise
        if claimed is not None:
            ledger.done(claimed[0])


def claims_for(outbox: Outbox, engine: Engine, *, owner: str, host: str) -> Claims:
    """The strategy of ``engine``'s database."""
    if engine.dialect.name == "sqlite":
        return LeasedRows(outbox, engine, owner=owner, host=host)
    return LockedRows(outbox)
