"""The orderly journal's sweeper: what dead consumers left is found and finished, leases renewed.

A consumer that dies mid-callback leaves its message in its spool file (this host) or in a row
of the journal table (:mod:`txmsg.sqla.journal`).  Nobody asks for it when it was its key's last
message, so every consumer process runs one thread that, every ``sweep_interval``, moves the
spools of this host's dead processes into the table and finishes the table's leftovers, each
key's in order; between sweeps it moves long-running messages into the table and renews the
leases of the rows this process handles.  Kept apart from the journal, which answers for one
message at a time on the consumer's threads; this is the background work over all of them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from sqlalchemy import select, update

from txmsg.sqla.engine import read_only
from txmsg.sqla.journal_table import Leftover, begin_write, insert_returning_id
from txmsg.sqla.models import OrderlyInflight, utcnow
from txmsg.sqla.parking import message_columns, sharding_key_of, stored_message
from txmsg.sqla.spool import orphans

if TYPE_CHECKING:
    from txmsg.sqla.journal import Finish, InflightJournal

log = logging.getLogger("txmsg.journal")


class JournalSweeper:
    """The background thread of one :class:`~txmsg.sqla.journal.InflightJournal`."""

    def __init__(self, journal: InflightJournal) -> None:
        self.journal = journal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, finish: Finish) -> None:
        """Move the spools of this host's dead consumers of the group into the table (before
        this process consumes anything: their messages come before the keys' next ones), then
        start the thread that renews leases, moves long-running messages into the table and
        finishes dead consumers' leftovers."""
        if self._thread is not None:
            return
        group = self.journal.group
        try:
            self.import_spools()
        except Exception:  # the database may be down: the first message's refresh tries again
            log.warning("group=%s: could not move dead consumers' spools yet", group, exc_info=True)
        self._thread = threading.Thread(
            target=self._run, args=(finish,), name=f"txmsg-journal-{group}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop the thread (a sweep in progress ends after its current leftover)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, finish: Finish) -> None:
        journal = self.journal
        renew_every = journal.lease.total_seconds() / 3
        tick = max(0.01, min(journal.sweep_interval, journal.promote_after / 2))
        renewed = swept = -float("inf")
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                journal.promote()
                if now - renewed >= renew_every:
                    self.renew()
                    renewed = now
                if now - swept >= journal.sweep_interval:
                    swept = now
                    self.import_spools()
                    self.sweep(finish)
            except Exception:  # the database may be down: try again next round
                log.warning(
                    "group=%s: journal sweep failed; trying again", journal.group, exc_info=True
                )
            self._stop.wait(tick)

    def renew(self) -> None:
        """Extend the leases of the rows this process is handling."""
        journal = self.journal
        running = journal.running_rows()
        if not running:
            return
        with journal.session_factory() as session, session.begin():
            session.execute(
                update(OrderlyInflight)
                .where(OrderlyInflight.id.in_(running), OrderlyInflight.owner == journal.owner)
                .values(lease_until=utcnow() + journal.lease)
            )

    def rows(self, limit: int = 100) -> list[tuple[Leftover, bool]]:
        """This group's rows, oldest first, each with whether its owner is gone."""
        journal = self.journal
        with journal.session_factory() as session, session.begin():
            read_only(session)
            rows = session.scalars(
                select(OrderlyInflight)
                .where(OrderlyInflight.consumer_group == journal.group)
                .order_by(OrderlyInflight.id)
                .limit(limit)
            ).all()
            now = utcnow()
            return [
                (
                    Leftover(
                        id=r.id, owner=r.owner, lease_until=r.lease_until, message=stored_message(r)
                    ),
                    journal.is_dead(r.owner, r.lease_until, r.id, now),
                )
                for r in rows
            ]

    def sweep(self, finish: Finish) -> int:
        """Finish leftovers of dead consumers, each key's in order; returns how many.

        A key with an earlier row that somebody is still handling (a live owner) waits: its
        later leftovers come after that one, in a later sweep."""
        journal = self.journal
        blocked: set[tuple[str, str]] = set()
        finished = 0
        for leftover, dead in self.rows():
            key = (leftover.message.topic, sharding_key_of(leftover.message))
            if self._stop.is_set():
                break
            if not dead or key in blocked or not journal.claim(leftover, "by the sweeper"):
                blocked.add(key)  # a later row of the key must wait for this one
                continue
            if finish(leftover.message, journal.leftover_ticket(leftover)):
                finished += 1
                journal.recovered += 1
            else:
                blocked.add(key)
        return finished

    def import_spools(self) -> int:
        """Copy the open entries of this host's dead processes' spools of the group into the
        table (as rows of their dead owners, so they are finished like any leftover), then delete
        those files.  Returns how many messages were copied."""
        journal = self.journal
        own = journal.spool_path
        moved = 0
        for claimed in orphans(journal.spool_directory, skip=own):
            try:
                orphan = claimed.orphan
                if orphan.messages:
                    now = utcnow()
                    with begin_write(journal.session_factory) as tx:
                        for message in orphan.messages:
                            values = message_columns(journal.group, message) | dict(
                                owner=orphan.owner, lease_until=now
                            )
                            if insert_returning_id(tx, values) is not None:
                                moved += 1
                    log.warning(
                        "group=%s: %d in-flight message(s) of consumer %s (gone) moved from its "
                        "spool %s to the journal table; see docs/librocketmq-hazards.md #10",
                        journal.group,
                        len(orphan.messages),
                        orphan.owner,
                        orphan.path,
                    )
                claimed.remove()
            finally:
                claimed.close()
        if moved:
            journal.imported += moved
        return moved
