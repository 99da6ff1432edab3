"""Issue 25, steps 2 and 3 at the database level: the relay's cycles on SQLite and PostgreSQL with
a real :class:`txmsg.Producer` over a scripted sender (the broker tests, test_outbox_broker.py,
use the real clients).  What a cycle takes (a key's rows in ``seq`` order, one after the other,
each once the one before was answered), the
stable key on every copy, back-off that holds a key's later rows while other keys flow, dead rows
(ERROR, hook, retry, discard), rows that can never be sent, two relays sharing rows on
PostgreSQL without breaking a key's order, one relay per SQLite database, and a database that
fails under the relay."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from outbox_kit import ScriptedSender, outbox_rows, scripted_producer
from sqlalchemy import insert, select, text
from txmsg_broker.testing import wait_until

from conftest import Db, make_db
from txmsg.errors import InvalidMessageError, SendError
from txmsg.message import DEDUP_KEY, SHARDING_KEY
from txmsg.sqla import create_engine, make_session_factory
from txmsg.sqla.models import utcnow
from txmsg.sqla.outbox import (
    Outbox,
    OutboxDeadEvent,
    OutboxMessage,
    OutboxRelayLease,
    OutboxState,
    Relay,
    RetryPolicy,
)
from txmsg.sqla.outbox.claims import LeasedRows

GROUP = "relay-outbox"


def outbox_on(db: Db, **options: Any) -> Outbox:
    return Outbox(group=GROUP, session_factory=db.sessions, **options)


def write(outbox: Outbox, db: Db, *messages: tuple[str | None, str]) -> None:
    """One transaction per message: (sharding key or None, body), topic "t"."""
    for key, body in messages:
        with db.sessions() as session, session.begin():
            outbox.send(session, "t", body, sharding_key=key)


@pytest.fixture
def sender() -> ScriptedSender:
    return ScriptedSender()


def test_a_cycle_sends_each_keys_rows_one_after_the_other_and_deletes_what_was_sent(
    db: Db, sender: ScriptedSender
) -> None:
    outbox = outbox_on(db)
    write(outbox, db, ("a", "a1"), ("a", "a2"), ("b", "b1"), (None, "p1"), ("a", "a3"), ("b", "b2"))
    relay = Relay(outbox, scripted_producer(sender))
    assert relay.cycle() == 6
    assert [m.body for m in sender.sent if m.sharding_key == "a"] == [b"a1", b"a2", b"a3"]
    assert [m.body for m in sender.sent if m.sharding_key == "b"] == [b"b1", b"b2"]
    assert relay.cycle() == 0
    assert outbox_rows(db.sessions) == []
    assert (relay.stats().sent, relay.stats().cycles) == (6, 2)


def test_a_keys_next_row_goes_only_once_the_broker_answered_the_one_before(db: Db) -> None:
    """One row per key in flight: with a1's answer held, a2 is not sent; other keys are."""
    outbox = outbox_on(db)
    write(outbox, db, ("a", "a1"), ("a", "a2"), ("b", "b1"))
    gated = ScriptedSender()
    gated.gate = threading.Event()
    relay = Relay(outbox, scripted_producer(gated))
    cycle = threading.Thread(target=relay.cycle)
    cycle.start()
    wait_until(lambda: gated.waiting == 2, timeout=30, message="a1 and b1 to be in flight")
    cycle.join(0.5)
    assert gated.waiting == 2  # a2 not handed to the client while a1 is unanswered
    gated.gate.set()
    cycle.join(30)
    assert [m.body for m in gated.sent if m.sharding_key == "a"] == [b"a1", b"a2"]
    assert outbox_rows(db.sessions) == []


def test_a_failed_row_ends_its_keys_chain_in_the_cycle(db: Db, sender: ScriptedSender) -> None:
    outbox = outbox_on(db, retry=RetryPolicy(max_attempts=5, first_delay=3600, max_delay=3600))
    write(outbox, db, ("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("b", "b2"))
    sender.fail = lambda m: SendError("broker busy") if m.body == b"a2" else None
    relay = Relay(outbox, scripted_producer(sender))
    assert relay.cycle() == 5
    assert sorted(sender.bodies()) == [b"a1", b"b1", b"b2"]  # a3 was never handed over
    rows = {r.body: r for r in outbox_rows(db.sessions)}
    assert set(rows) == {b"a2", b"a3"}
    assert (rows[b"a2"].attempts, rows[b"a3"].attempts) == (1, 0)
    assert relay.cycle() == 0  # a2 waits its back-off, a3 behind it


def test_every_copy_carries_the_rows_stable_key_and_its_options(
    db: Db, sender: ScriptedSender
) -> None:
    outbox = outbox_on(db)
    with db.sessions() as session, session.begin():
        keyed = outbox.send(
            session,
            "t",
            b"k",
            sharding_key="order-7",
            keys="o7",
            tags="PAID",
            properties={"p": "v"},
        )
        plain = outbox.send(session, "t", b"p", delay_level=3)
    Relay(outbox, scripted_producer(sender)).cycle()
    by_body = {m.body: m for m in sender.sent}
    k, p = by_body[b"k"], by_body[b"p"]
    assert (k.sharding_key, k.keys, k.tags, k.properties["p"]) == ("order-7", "o7", "PAID", "v")
    assert k.properties[DEDUP_KEY] == keyed.message_key
    assert SHARDING_KEY not in k.properties  # the backend sets it from sharding_key
    assert (p.sharding_key, p.delay_level, p.properties[DEDUP_KEY]) == (None, 3, plain.message_key)


def test_a_failed_send_waits_its_back_off_and_holds_its_keys_later_rows(
    db: Db, sender: ScriptedSender
) -> None:
    outbox = outbox_on(db, retry=RetryPolicy(max_attempts=5, first_delay=3600, max_delay=3600))
    write(outbox, db, ("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2"), (None, "p1"))
    sender.fail = lambda m: SendError("broker busy") if m.body == b"a1" else None
    relay = Relay(outbox, scripted_producer(sender))
    relay.cycle()
    relay.cycle()
    relay.cycle()
    assert sorted(sender.bodies()) == [b"b1", b"b2", b"p1"]  # other keys flowed
    rows = {r.body: r for r in outbox_rows(db.sessions)}
    assert set(rows) == {b"a1", b"a2"}  # a2 waits behind a1, a1 waits its hour
    a1 = rows[b"a1"]
    assert (a1.state, a1.attempts) == (OutboxState.PENDING, 1)
    assert a1.last_error == "SendError: broker busy"
    assert a1.next_attempt_at > utcnow() + timedelta(minutes=59)
    assert relay.stats().in_back_off == 1
    # the back-off over (as if an hour had passed): a1, then a2
    with db.sessions() as session, session.begin():
        session.execute(OutboxMessage.__table__.update().values(next_attempt_at=utcnow()))
    sender.fail = lambda m: None
    relay.cycle()
    relay.cycle()
    assert sender.bodies()[-2:] == [b"a1", b"a2"]


def test_after_the_last_attempt_a_row_is_dead_logged_hooked_and_retried_by_an_operator(
    db: Db, sender: ScriptedSender, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = outbox_on(db, retry=RetryPolicy(max_attempts=3, first_delay=0, max_delay=0))
    write(outbox, db, ("a", "a1"), ("a", "a2"), ("b", "b1"))
    sender.fail = lambda m: SendError("no route") if m.body == b"a1" else None
    dead: list[OutboxDeadEvent] = []
    relay = Relay(outbox, scripted_producer(sender), hooks=[dead.append, lambda e: 1 / 0])
    with caplog.at_level(logging.ERROR, logger="txmsg.outbox"):
        for _ in range(5):
            relay.cycle()
    assert sender.bodies() == [b"b1"]
    (event,) = dead
    assert (event.group, event.sharding_key, event.attempts, event.permanent) == (
        GROUP,
        "a",
        3,
        False,
    )
    assert event.error == "SendError: no route"
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("dead after 3 attempts" in m and "txmsg outbox retry" in m for m in errors)
    assert any("on_outbox_dead hook" in m for m in errors)  # a raising hook is logged, ignored
    stats = outbox.stats()
    assert (stats.unsent, stats.dead) == (1, 1)  # a2 waits behind the dead a1
    assert stats.oldest_unsent_age is not None
    (dead_row,) = outbox.rows(state="DEAD")
    assert (dead_row.id, dead_row.message.body, dead_row.attempts) == (event.id, b"a1", 3)
    sender.fail = lambda m: None
    assert outbox.retry_dead(ids=[event.id]) == [event.id]
    relay.cycle()
    relay.cycle()
    assert sender.bodies() == [b"b1", b"a1", b"a2"]
    assert outbox.stats().unsent == outbox.stats().dead == 0


def test_a_discarded_dead_row_lets_its_keys_later_rows_go(db: Db, sender: ScriptedSender) -> None:
    outbox = outbox_on(db, retry=RetryPolicy(max_attempts=1))
    write(outbox, db, ("a", "a1"), ("a", "a2"))
    sender.fail = lambda m: SendError("x") if m.body == b"a1" else None
    relay = Relay(outbox, scripted_producer(sender))
    relay.cycle()
    assert outbox.stats().dead == 1
    assert outbox.discard_dead(sharding_key="a") != []
    relay.cycle()
    assert sender.bodies() == [b"a2"]


def test_what_can_never_be_sent_is_dead_at_once_with_the_reason(
    db: Db, sender: ScriptedSender
) -> None:
    outbox = outbox_on(db)
    write(outbox, db, ("a", "a1"), (None, "ok"))
    # a row no send() would write (another writer, an older version): its topic is invalid
    with db.sessions() as session, session.begin():
        session.execute(
            insert(OutboxMessage).values(
                outbox=GROUP,
                message_key="x" * 32,
                topic="bad topic!",
                properties={},
                body=b"b",
                state="PENDING",
                attempts=0,
                next_attempt_at=utcnow(),
                created_at=utcnow(),
            )
        )
    sender.fail = lambda m: (
        InvalidMessageError("topic t is NORMAL, ordered sends need --type FIFO")
        if m.sharding_key
        else None
    )
    dead: list[OutboxDeadEvent] = []
    relay = Relay(outbox, scripted_producer(sender), hooks=[dead.append])
    relay.cycle()
    assert sender.bodies() == [b"ok"]
    by_topic = {e.topic: e for e in dead}
    assert set(by_topic) == {"t", "bad topic!"}
    assert all(e.permanent and e.attempts == 1 for e in dead)
    assert "FIFO" in by_topic["t"].error
    assert by_topic["bad topic!"].error.startswith("InvalidNameError")
    assert {r.message.body: r.last_error for r in outbox.rows(state="DEAD")}.keys() == {b"a1", b"b"}


def test_a_closing_producer_leaves_rows_untouched(db: Db, sender: ScriptedSender) -> None:
    outbox = outbox_on(db)
    write(outbox, db, ("a", "a1"))
    producer = scripted_producer(sender)
    producer.close()
    relay = Relay(outbox, producer)
    relay.cycle()
    (row,) = outbox_rows(db.sessions)
    assert (row.state, row.attempts, row.last_error) == (OutboxState.PENDING, 0, None)


def test_the_relay_thread_is_woken_by_the_commit(db: Db, sender: ScriptedSender) -> None:
    """The poll is a minute: a row sent within the wait was sent because its commit woke the
    relay."""
    outbox = outbox_on(db, poll_interval=60.0, lease=300.0)
    relay = outbox.start_relay(scripted_producer(sender))
    try:
        wait_until(lambda: relay.stats().cycles >= 1, timeout=30, message="the first cycle")
        write(outbox, db, ("a", "a1"), ("a", "a2"), (None, "p"))
        wait_until(lambda: len(sender.sent) == 3, timeout=45, message="the woken relay's sends")
        assert [m.body for m in sender.sent if m.sharding_key] == [b"a1", b"a2"]
    finally:
        outbox.stop_relay()
    assert relay.state == "closed"


def test_postgresql_relays_share_rows_without_breaking_a_keys_order(pg: Db) -> None:
    """Relay A is in the middle of sending a1 and b1 (its rows locked); relay B's cycles take the
    other keys and nothing of a or b - whose next rows A sends after a1 and b1, in order."""
    shared = ScriptedSender()
    outbox_a = Outbox(group=GROUP, session_factory=pg.sessions, batch_size=2)
    outbox_b = Outbox(group=GROUP, session_factory=pg.sessions, batch_size=10)
    write(
        outbox_a,
        pg,
        ("a", "a1"),
        ("b", "b1"),
        ("c", "c1"),
        ("a", "a2"),
        ("b", "b2"),
        ("c", "c2"),
        (None, "p1"),
    )
    gated = ScriptedSender()
    gated.gate = threading.Event()
    relay_a = Relay(outbox_a, scripted_producer(gated))
    relay_b = Relay(outbox_b, scripted_producer(shared))
    a_cycle = threading.Thread(target=relay_a.cycle)
    a_cycle.start()
    wait_until(lambda: gated.waiting == 2, timeout=30, message="relay A to be sending a1 and b1")
    relay_b.cycle()
    assert sorted(shared.bodies()) == [b"c1", b"c2", b"p1"]  # c's rows one after the other
    assert relay_b.cycle() == 0  # a2 and b2 wait behind the rows A holds
    gated.gate.set()
    a_cycle.join(30)
    # A sends a2 and b2 after a1 and b1, in its own cycle
    assert [m.body for m in gated.sent if m.sharding_key == "a"] == [b"a1", b"a2"]
    assert [m.body for m in gated.sent if m.sharding_key == "b"] == [b"b1", b"b2"]
    assert relay_b.cycle() == 0
    assert len(shared.bodies()) == 3  # B never took a row of a or b
    assert outbox_rows(pg.sessions) == []


def _backend_alive(db: Db, application_name: str) -> bool:
    with db.engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT 1 FROM pg_stat_activity WHERE application_name = :name"),
                {"name": application_name},
            ).first()
        )


def test_postgresql_a_killed_relays_locks_go_with_its_connection(pg: Db) -> None:
    """A relay's connection dies mid-send (its process killed): the rows it held are taken by
    the next relay (and sent again: the idempotent consumers absorb the copy)."""
    outbox = outbox_on(pg)
    write(outbox, pg, ("a", "a1"), ("a", "a2"))
    with pg.engine.connect() as victim:
        victim.execute(text("SET application_name = 'dying-relay'"))
        victim.commit()
        victim.begin()
        held = victim.execute(
            select(OutboxMessage.id).where(OutboxMessage.body == b"a1").with_for_update()
        ).all()
        assert len(held) == 1
        other = ScriptedSender()
        relay = Relay(outbox, scripted_producer(other))
        assert relay.cycle() == 0  # a1 is held, a2 waits behind it
        with pg.engine.begin() as admin:
            admin.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'dying-relay'"
                )
            )
        victim.invalidate()  # closes its dead DBAPI connection
    wait_until(lambda: not _backend_alive(pg, "dying-relay"), timeout=30, message="its exit")
    relay.cycle()
    relay.cycle()
    assert other.bodies() == [b"a1", b"a2"]


def _lease(db: Db) -> OutboxRelayLease | None:
    with db.sessions() as session:
        return session.get(OutboxRelayLease, GROUP)


def test_sqlite_one_relay_per_database_the_second_stands_by(sqlite: Db) -> None:
    first_sender, second_sender = ScriptedSender(), ScriptedSender()
    first_outbox = outbox_on(sqlite, poll_interval=0.05)
    second_outbox = outbox_on(sqlite, poll_interval=0.05)
    first = first_outbox.start_relay(scripted_producer(first_sender))
    try:
        wait_until(
            lambda: (lease := _lease(sqlite)) is not None and lease.owner == first.owner,
            timeout=30,
            message="the first relay's lease",
        )
        second = second_outbox.start_relay(scripted_producer(second_sender))
        wait_until(lambda: second.state == "standby", timeout=30, message="the second to stand by")
        write(first_outbox, sqlite, ("a", "a1"))
        wait_until(lambda: first_sender.bodies() == [b"a1"], timeout=30)
        first_outbox.stop_relay()
        wait_until(lambda: second.state == "running", timeout=30, message="the take-over")
        write(first_outbox, sqlite, ("a", "a2"))
        wait_until(lambda: second_sender.bodies() == [b"a2"], timeout=30)
        assert first_sender.bodies() == [b"a1"]
    finally:
        first_outbox.stop_relay()
        second_outbox.stop_relay()


def test_sqlite_a_dead_relays_lease_is_taken_over_at_once(sqlite: Db) -> None:
    outbox = outbox_on(sqlite)
    relay = Relay(outbox, scripted_producer(ScriptedSender()))
    relay.cycle()  # checks the database
    far = utcnow() + timedelta(hours=1)
    with sqlite.sessions() as session, session.begin():
        session.add(
            OutboxRelayLease(
                outbox=GROUP, owner=f"{relay.host}:999999999:gone", lease_until=far, since=utcnow()
            )
        )
    claims = relay.claims
    assert isinstance(claims, LeasedRows)
    assert relay._ready(claims)  # the holder's process does not exist: taken over
    with sqlite.sessions() as session, session.begin():
        lease = session.get(OutboxRelayLease, GROUP)
        assert lease is not None
        lease.owner = "other-host:1:alive"
    claims.renewed = -1e18
    assert not relay._ready(claims)  # a live holder elsewhere: stand by until its lease ends
    assert relay.state == "standby"
    with sqlite.sessions() as session, session.begin():
        lease = session.get(OutboxRelayLease, GROUP)
        assert lease is not None
        lease.lease_until = utcnow() - timedelta(seconds=1)
    assert relay._ready(claims)


@pytest.fixture
def impatient(tmp_path: Any) -> Iterator[Db]:
    """A SQLite database whose relay gives up on a locked database after 50 ms."""
    for db in make_db("sqlite", tmp_path):
        engine = create_engine(db.url, sqlite_busy_timeout_ms=50)
        yield Db(db.name, db.url, engine, make_session_factory(engine))
        engine.dispose()


def test_a_failing_database_makes_the_relay_back_off_and_resume(
    impatient: Db, caplog: pytest.LogCaptureFixture
) -> None:
    db = impatient
    sender = ScriptedSender()
    outbox = outbox_on(db, poll_interval=0.05, lease=1.0 * 3)
    relay = outbox.start_relay(scripted_producer(sender))
    blocker_engine = create_engine(db.url)
    blocker = blocker_engine.raw_connection()
    try:
        write(outbox, db, ("a", "a1"))
        wait_until(lambda: sender.bodies() == [b"a1"], timeout=30, message="the first send")
        cursor = blocker.cursor()
        cursor.execute("BEGIN EXCLUSIVE")  # no other writer now: the lease cannot be renewed
        with caplog.at_level(logging.WARNING, logger="txmsg.outbox"):
            wait_until(
                lambda: any("relay cycle failed" in r.getMessage() for r in caplog.records),
                timeout=30,
                message="the relay to fail on the locked database",
            )
        blocker.rollback()
        write(outbox, db, ("a", "a2"))
        wait_until(lambda: sender.bodies()[-1:] == [b"a2"], timeout=60, message="the next send")
        assert relay.state == "running"
    finally:
        blocker.close()
        blocker_engine.dispose()
        outbox.stop_relay()
