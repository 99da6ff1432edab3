"""Waking a relay in another process at the writer's commit: PostgreSQL ``LISTEN/NOTIFY``.

Why: a relay in a process of its own (``txmsg outbox relay``, writers declared with
``relay=False``) is not woken by the writers' ``after_commit`` - that wakes only relays of the
writer's own process - so without this it finds their rows at its next poll, ``poll_interval``
(1 s) after the commit in the worst case.  With it, :meth:`txmsg.sqla.outbox.Outbox.send` notifies the
outbox's channel inside the writer's transaction, with the row's INSERT (once per transaction;
PostgreSQL delivers a notification only when, and only if, its transaction commits), and each
relay of the outbox on PostgreSQL holds a connection that ``LISTEN``\\ s on the channel and wakes
the relay when one arrives.  A rollback notifies nobody.  The poll stays: rows of a transaction
whose notification was lost (the listening connection was down at the moment) still go.

A writer whose process runs the outbox's relay does not notify: its commit wakes that relay
directly, and a notification costs PostgreSQL's commit-time notification lock (transactions
that notify commit one at a time).  Other databases (SQLite) have no ``NOTIFY``:
their relays in other processes rely on the poll.

Listening needs the driver's notification API: psycopg (3) and psycopg2 are supported; with
another driver (asyncpg through SQLAlchemy's adapter, pg8000) the relay logs it once and polls.
"""

from __future__ import annotations

import hashlib
import logging
import select
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from txmsg.sqla.outbox.policy import pause_after_failure

log = logging.getLogger("txmsg.outbox")

NOTIFIED_MARK = "txmsg_outbox_notified"
"""``session.info`` key: (the root transaction, the channels it has notified)."""


def channel_of(group: str) -> str:
    """The outbox's notification channel: a fixed-length identifier of the group (a group name
    may be longer than PostgreSQL's 63-byte identifiers or need quoting).  Outboxes of one group
    in several schemas of a database share it; a relay woken for another schema's row runs one
    cycle that finds nothing."""
    return "txmsg_outbox_" + hashlib.sha256(group.encode()).hexdigest()[:20]


def needed(session: Session, channel: str) -> bool:
    """Whether the row :meth:`txmsg.sqla.outbox.Outbox.send` writes now should notify
    ``channel``: on PostgreSQL, unless this transaction did already.

    The notification rides on the row's INSERT (``RETURNING pg_notify(...)``,
    :func:`txmsg.sqla.outbox.writer.write_row`): no round trip of its own.  Inside a savepoint
    it is always needed (and :func:`mark` remembers nothing there): a savepoint rolled back takes
    its notifications with it, so a mark set there could leave the transaction's rows without
    one.  PostgreSQL folds one transaction's notifications of a channel into one anyway; the mark
    only saves the work."""
    if session.connection().dialect.name != "postgresql":
        return False
    mark = session.info.get(NOTIFIED_MARK)
    return mark is None or mark[0] is not session.get_transaction() or channel not in mark[1]


def mark(session: Session, channel: str) -> None:
    """The row just written notified ``channel`` (see :func:`needed`)."""
    if session.in_nested_transaction():
        return
    root = session.get_transaction()
    info = session.info
    found = info.get(NOTIFIED_MARK)
    if found is None or found[0] is not root:
        info[NOTIFIED_MARK] = (root, {channel})
    else:
        found[1].add(channel)


def forget(info: dict[Any, Any]) -> None:
    """The transaction ended (commit or rollback): drop its mark."""
    info.pop(NOTIFIED_MARK, None)


class CommitListener:
    """A thread holding a connection that ``LISTEN``\\ s on an outbox's channel and calls
    ``wake`` for every notification (and once after each reconnection, for what was committed
    while it was down)."""

    def __init__(self, engine: Engine, channel: str, wake: Callable[[], None], name: str) -> None:
        self.engine = engine
        self.channel = channel
        self.wake = wake
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._driver: Any = None
        self.listening = threading.Event()
        """Set while the connection listens (tests wait for it before committing)."""

    def start(self) -> CommitListener:
        self._thread = threading.Thread(
            target=self._run, name=f"txmsg-outbox-listen-{self.name}", daemon=True
        )
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                raw = self._connect()
            except Exception as exc:  # noqa: BLE001 - logged by pause_after_failure
                failures += 1
                pause_after_failure(
                    self._stop,
                    failures,
                    self.name,
                    "cannot LISTEN for commits",
                    exc,
                    "the relay polls",
                )
                continue
            if raw is None:
                return  # a driver without notifications: the relay polls
            try:
                failures = 0
                self.listening.set()
                self.wake()  # commits while nobody listened
                self._listen(raw)
            except Exception as exc:  # noqa: BLE001 - reconnect; the relay polls meanwhile
                if not self._stop.is_set():
                    log.warning(
                        "outbox=%s: the LISTEN connection failed (%s); reconnecting",
                        self.name,
                        exc,
                    )
                    self._stop.wait(0.5)
            finally:
                self.listening.clear()
                try:
                    raw.close()
                except Exception:  # noqa: BLE001 - it is going anyway
                    log.debug("outbox=%s: closing the LISTEN connection failed", self.name)

    def _connect(self) -> Any:
        """A connection of its own (detached from the pool: it is never handed to another user)
        in autocommit, listening; None when the driver has no notification API."""
        pooled = self.engine.raw_connection()
        driver: Any = pooled.driver_connection  # before detach(), which forgets it
        pooled.detach()
        self._driver = driver
        module = type(driver).__module__.split(".")[0]
        try:
            if module in ("psycopg", "psycopg2"):
                if module == "psycopg2":
                    driver.set_session(autocommit=True)
                else:
                    driver.rollback()
                    driver.autocommit = True
                cursor = driver.cursor()
                cursor.execute(f"LISTEN {self.channel}")
                cursor.close()
                return pooled
        except BaseException:
            pooled.close()
            raise
        pooled.close()
        log.info(
            "outbox=%s: the %s driver has no notification API txmsg uses (psycopg, psycopg2); "
            "the relay finds other processes' rows at its poll",
            self.name,
            module,
        )
        return None

    def _listen(self, pooled: Any) -> None:
        driver = self._driver
        if type(driver).__module__.startswith("psycopg2"):
            while not self._stop.is_set():
                if select.select([driver], [], [], 0.5)[0]:
                    driver.poll()
                    if driver.notifies:
                        driver.notifies.clear()
                        self.wake()
            return
        while not self._stop.is_set():
            # psycopg 3: the generator ends after the timeout; at most one wake per batch
            for _ in driver.notifies(timeout=0.5, stop_after=1):
                self.wake()
