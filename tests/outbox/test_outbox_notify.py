"""Issue 38: a relay in another process is woken by the writer's commit (PostgreSQL LISTEN/NOTIFY,
txmsg.sqla.outbox.notify), not only by its poll.

Each wait is for an event; the relay's poll is an hour, so a row that reaches the sender within
the wait was sent because the commit's notification woke the relay.  "Another process" is a
second :class:`Outbox` of the same group and database in this process: the writer's outbox has
no relay of its own, so its commits wake nothing here directly (``after_commit`` wakes only the
relays of the outboxes a session wrote to).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from outbox_kit import ScriptedSender, outbox_rows, scripted_producer
from sqlalchemy import event
from txmsg_broker.testing import wait_until

from conftest import Db
from txmsg.sqla.outbox import Outbox
from txmsg.sqla.outbox.notify import CommitListener, channel_of

GROUP = "notify-outbox"


@pytest.fixture
def notifies(pg: Db) -> Iterator[list[str]]:
    """The writers' statements that notify (the row's INSERT with ``pg_notify``)."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "pg_notify" in statement:
            seen.append(statement)

    event.listen(pg.engine, "before_cursor_execute", record)
    yield seen
    event.remove(pg.engine, "before_cursor_execute", record)


def test_a_relay_elsewhere_is_woken_by_the_commit_not_its_poll(pg: Db) -> None:
    writer = Outbox(group=GROUP, session_factory=pg.sessions, relay=False)
    elsewhere = Outbox(
        group=GROUP, session_factory=pg.sessions, poll_interval=3600.0, lease=3 * 3600.0
    )
    sender = ScriptedSender()
    relay = elsewhere.start_relay(scripted_producer(sender))
    try:
        assert relay.listener is not None
        assert relay.listener.listening.wait(30)
        wait_until(lambda: relay.stats().cycles >= 1, timeout=30, message="the first cycle")
        with pg.sessions() as session, session.begin():
            writer.send(session, "t", "k1", sharding_key="k")
            writer.send(session, "t", "plain")
        wait_until(lambda: len(sender.sent) == 2, timeout=45, message="the notified relay")
        assert sorted(m.body for m in sender.sent) == [b"k1", b"plain"]
        wait_until(lambda: not outbox_rows(pg.sessions), timeout=30, message="rows deleted")
    finally:
        elsewhere.stop_relay()


def test_one_notify_per_transaction_none_after_a_rollback(pg: Db, notifies: list[str]) -> None:
    writer = Outbox(group=GROUP, session_factory=pg.sessions, relay=False)
    with pg.sessions() as session, session.begin():
        writer.send(session, "t", "a", sharding_key="k")
        writer.send(session, "t", "b")
        writer.send(session, "t", "c", sharding_key="k")
    assert len(notifies) == 1
    assert notifies[0].startswith("INSERT")
    with pg.sessions() as session:
        session.begin()
        writer.send(session, "t", "gone")
        session.rollback()
    with pg.sessions() as session, session.begin():  # a new transaction notifies again
        writer.send(session, "t", "d")
    assert len(notifies) == 3


def test_a_savepoint_notifies_on_its_own(pg: Db, notifies: list[str]) -> None:
    """A savepoint rolled back takes its NOTIFY with it: the transaction's later row must
    notify again."""
    writer = Outbox(group=GROUP, session_factory=pg.sessions, relay=False)
    with pg.sessions() as session, session.begin():
        savepoint = session.begin_nested()
        writer.send(session, "t", "undone")
        savepoint.rollback()
        writer.send(session, "t", "kept")
    assert len(notifies) == 2
    assert [r.body for r in outbox_rows(pg.sessions)] == [b"kept"]


def test_a_writer_beside_its_own_relay_does_not_notify(pg: Db, notifies: list[str]) -> None:
    """Its commit wakes its relay directly."""
    outbox = Outbox(
        group=GROUP, session_factory=pg.sessions, poll_interval=3600.0, lease=3 * 3600.0
    )
    sender = ScriptedSender()
    outbox.start_relay(scripted_producer(sender))
    try:
        with pg.sessions() as session, session.begin():
            outbox.send(session, "t", "x")
        wait_until(lambda: len(sender.sent) == 1, timeout=45, message="the woken relay")
    finally:
        outbox.stop_relay()
    assert notifies == []


def test_the_listener_wakes_once_it_listens_again(pg: Db) -> None:
    """After (re)connecting it wakes the relay once: commits while nobody listened."""
    woken = threading.Event()
    listener = CommitListener(pg.engine, channel_of(GROUP), woken.set, GROUP).start()
    try:
        assert woken.wait(30)
        assert listener.listening.is_set()
    finally:
        listener.close()
