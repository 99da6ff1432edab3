"""Issue 25, step 1: ``outbox.send(session, ...)`` writes a row in the caller's transaction, on
SQLite and PostgreSQL - visible only after the commit, gone with a rollback, refused at once when
it could never be sent - and numbers a sharding key's rows in the order their transactions commit,
also with writers of one key racing on PostgreSQL, where ids are not commit order."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from outbox_kit import Order, bodies_by_seq, outbox_rows
from sqlalchemy import inspect, select, text
from sqlalchemy.orm import Session, scoped_session
from txmsg_broker.testing import wait_until

from conftest import Db
from txmsg import (
    InvalidMessageError,
    InvalidNameError,
    LifecycleError,
    ListenerDefinitionError,
    TxMsg,
    TxMsgConfig,
)
from txmsg.errors import ConfigError
from txmsg.message import DEDUP_KEY, SHARDING_KEY
from txmsg.sqla.models import utcnow
from txmsg.sqla.outbox import Outbox, OutboxKey, OutboxMessage, OutboxState, purge_idle_keys

GROUP = "orders-outbox"


def app_with_outbox(db: Db, **options: Any) -> tuple[TxMsg, Outbox]:
    app = TxMsg(TxMsgConfig(), backend="rocketmq")
    return app, app.add_outbox(group=GROUP, session_factory=db.sessions, **options)


def roll_back(db: Db, work: Callable[[Session], Any]) -> None:
    """Run ``work`` in a transaction that then fails (RuntimeError): it rolls back."""
    with db.sessions() as session, session.begin():
        work(session)
        raise RuntimeError("the business transaction fails")


def test_create_tables_creates_the_outbox_tables(db: Db) -> None:
    names = set(inspect(db.engine).get_table_names())
    assert {"txmsg_outbox_message", "txmsg_outbox_key", "txmsg_outbox_relay"} <= names


def test_a_committed_send_is_a_row_a_rolled_back_one_is_nothing(db: Db) -> None:
    _, outbox = app_with_outbox(db)
    with db.sessions() as session, session.begin():
        session.add(Order(ref="paid"))
        receipt = outbox.send(
            session,
            "order-events",
            {"order": 1},
            keys=["o-1", "c-9"],
            tags="PAID",
            properties={"source": "test", "n": 3},
        )

    def failing(session: Session) -> None:
        session.add(Order(ref="failed"))
        outbox.send(session, "order-events", {"order": 2})

    with pytest.raises(RuntimeError, match="fails"):
        roll_back(db, failing)
    (row,) = outbox_rows(db.sessions)
    assert (row.id, row.message_key, row.seq) == (receipt.id, receipt.message_key, None)
    assert (row.outbox, row.topic, row.tags, row.keys) == (GROUP, "order-events", "PAID", "o-1 c-9")
    assert row.body == b'{"order":1}'
    assert row.properties == {"source": "test", "n": "3"}
    assert (row.state, row.attempts, row.last_error) == (OutboxState.PENDING, 0, None)
    assert len(row.message_key) == 32
    with db.sessions() as session:
        assert session.scalars(select(Order.ref)).all() == ["paid"]


def test_nothing_is_visible_to_other_transactions_before_the_commit(db: Db) -> None:
    _, outbox = app_with_outbox(db)
    session = db.sessions()
    try:
        session.begin()
        outbox.send(session, "order-events", b"x")
        if db.name == "postgresql":  # SQLite's one writer holds the lock; readers see the past
            assert outbox_rows(db.sessions) == []
        assert outbox.stats().unsent == 0
        session.commit()
    finally:
        session.close()
    assert outbox.stats().unsent == 1


def test_what_could_never_be_sent_is_refused_in_the_transaction(db: Db) -> None:
    _, outbox = app_with_outbox(db, max_body_bytes=1024)
    when = datetime.now(UTC) + timedelta(minutes=5)
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"topic": "bad topic!"}, InvalidNameError, "RocketMQ names"),
        ({"payload": b"x" * 1025}, InvalidMessageError, "over the outbox's max_body_bytes"),
        ({"payload": object()}, InvalidMessageError, "converter"),
        ({"sharding_key": "k", "delay_level": 3}, InvalidMessageError, "cannot be delayed"),
        ({"sharding_key": "k", "deliver_at": when}, InvalidMessageError, "cannot be delayed"),
        ({"delay_level": 3, "deliver_at": when}, InvalidMessageError, "not both"),
        ({"delay_level": 19}, InvalidMessageError, "1..18"),
        ({"delay_level": True}, InvalidMessageError, "1..18"),
        ({"deliver_at": datetime(2030, 1, 1)}, InvalidMessageError, "aware datetime"),
        ({"deliver_at": -1}, InvalidMessageError, ">= 0"),
        ({"sharding_key": " "}, InvalidMessageError, "non-blank"),
        ({"sharding_key": "k" * 256}, InvalidMessageError, "at most 255"),
        ({"properties": {DEDUP_KEY: "x"}}, InvalidMessageError, "set by txmsg"),
        ({"properties": {SHARDING_KEY: "x"}}, InvalidMessageError, "set by txmsg"),
    ]
    with db.sessions() as session, session.begin():
        session.add(Order(ref="kept"))
        for overrides, error, words in cases:
            args: dict[str, Any] = {"topic": "order-events", "payload": b"x"} | overrides
            topic, payload = args.pop("topic"), args.pop("payload")
            with pytest.raises(error, match=words):
                outbox.send(session, topic, payload, **args)
        # the caller's transaction goes on: a refused send wrote nothing and broke nothing
        outbox.send(session, "order-events", b"fine", delay_level=2)
        outbox.send(session, "order-events", b"later", deliver_at=when)
    rows = outbox_rows(db.sessions)
    assert [r.body for r in rows] == [b"fine", b"later"]
    assert (rows[0].delay_level, rows[1].deliver_at_ms) == (2, round(when.timestamp() * 1000))
    with (
        db.engine.connect() as conn,
        pytest.raises(InvalidMessageError, match="SQLAlchemy Session"),
    ):
        outbox.send(conn, "order-events", b"x")  # type: ignore[arg-type]


def test_a_keys_rows_are_numbered_per_key_in_commit_order(db: Db) -> None:
    _, outbox = app_with_outbox(db)
    for n in range(3):
        with db.sessions() as session, session.begin():
            first = outbox.send(session, "t", f"a{n}", sharding_key="a")
            outbox.send(session, "t", f"b{n}", sharding_key="b")
            plain = outbox.send(session, "t", f"plain{n}")
            assert plain.seq is None
            assert first.seq == n + 1
    with db.sessions() as session, session.begin():  # two rows of a key in one transaction
        assert [outbox.send(session, "t", f"a{n}", sharding_key="a").seq for n in (3, 4)] == [4, 5]
    assert bodies_by_seq(db.sessions, "a") == [f"a{n}".encode() for n in range(5)]
    assert bodies_by_seq(db.sessions, "b") == [f"b{n}".encode() for n in range(3)]


def test_outboxes_of_one_database_number_their_keys_apart(db: Db) -> None:
    app = TxMsg(TxMsgConfig(), backend="rocketmq")
    first = app.add_outbox(group="first-outbox", session_factory=db.sessions)
    second = app.add_outbox(group="second-outbox", session_factory=db.sessions)
    with db.sessions() as session, session.begin():
        assert first.send(session, "t", b"1", sharding_key="k").seq == 1
        assert second.send(session, "t", b"1", sharding_key="k").seq == 1
        assert first.send(session, "t", b"2", sharding_key="k").seq == 2
    assert (first.stats().unsent, second.stats().unsent) == (2, 1)


def _waiting_for_a_lock(db: Db, application_name: str) -> bool:
    with db.engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = :name "
                    "AND wait_event_type = 'Lock'"
                ),
                {"name": application_name},
            ).first()
        )


def test_postgresql_a_later_writer_of_a_key_waits_for_the_earlier_to_commit(pg: Db) -> None:
    """The race the issue warns about: B starts after A, and with ids alone B's row could commit
    first.  B waits at the key's lock until A committed, so B's row comes after A's; and if A
    rolls back, B takes its place with no gap."""
    _, outbox = app_with_outbox(pg)
    a_wrote, a_may_end = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def writer_a(commit: bool) -> None:
        with pg.sessions() as session:
            session.begin()
            outcome["a"] = outbox.send(session, "t", b"A", sharding_key="order-1")
            a_wrote.set()
            a_may_end.wait(30)
            session.commit() if commit else session.rollback()

    def writer_b() -> None:
        with pg.sessions() as session, session.begin():
            session.execute(text("SET application_name = 'outbox-writer-b'"))
            session.add(Order(ref="b"))  # B's own id comes before A's row is numbered... or not
            outcome["b"] = outbox.send(session, "t", b"B", sharding_key="order-1")

    for commit in (True, False):
        a_wrote.clear()
        a_may_end.clear()
        a = threading.Thread(target=writer_a, args=(commit,))
        a.start()
        assert a_wrote.wait(30)
        b = threading.Thread(target=writer_b)
        b.start()
        wait_until(
            lambda: _waiting_for_a_lock(pg, "outbox-writer-b"),
            timeout=30,
            message="writer B to wait for the key's lock held by A",
        )
        assert "b" not in outcome  # B has no number while A's transaction is open
        a_may_end.set()
        a.join(30)
        b.join(30)
        if commit:
            assert (outcome["a"].seq, outcome["b"].seq) == (1, 2)
            assert bodies_by_seq(pg.sessions, "order-1") == [b"A", b"B"]
        else:
            assert outcome["b"].seq == 3  # after the committed A (1) and B (2): A's 3 is gone
            assert bodies_by_seq(pg.sessions, "order-1") == [b"A", b"B", b"B"]
        del outcome["b"]


def test_concurrent_writers_of_one_key_get_commit_ordered_numbers(db: Db) -> None:
    """Eight threads commit 15 transactions each on one key, with other keys and business rows in
    between.  Each thread's transactions commit one after the other, so its rows must come out in
    its own order; all numbers are distinct and consecutive."""
    _, outbox = app_with_outbox(db)
    threads, per_thread = 8, 15
    errors: list[BaseException] = []
    rng = random.Random(25)
    pauses = [[rng.random() / 200 for _ in range(per_thread)] for _ in range(threads)]
    start = threading.Barrier(threads)

    def writer(t: int) -> None:
        try:
            start.wait(30)
            for i in range(per_thread):
                with db.sessions() as session, session.begin():
                    session.add(Order(ref=f"{t}-{i}"))
                    if i % 3 == 0:
                        outbox.send(session, "t", f"other-{t}-{i}", sharding_key=f"other-{t}")
                    outbox.send(session, "t", f"{t}/{i}", sharding_key="hot")
                    threading.Event().wait(pauses[t][i])  # hold the transaction open a moment
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert errors == []
    hot = [r for r in outbox_rows(db.sessions) if r.sharding_key == "hot"]
    assert sorted(r.seq or 0 for r in hot) == list(range(1, threads * per_thread + 1))
    in_order = [r.body.decode() for r in sorted(hot, key=lambda r: r.seq or 0)]
    for t in range(threads):
        mine = [int(body.split("/")[1]) for body in in_order if body.startswith(f"{t}/")]
        assert mine == list(range(per_thread))


def test_sqlite_writers_take_no_key_lock_row(sqlite: Db) -> None:
    """SQLite numbers a key's rows under its one write lock: the lock row would be a statement
    per send for nothing (writer.write_row)."""
    _, outbox = app_with_outbox(sqlite)
    with sqlite.sessions() as session, session.begin():
        assert outbox.send(session, "t", b"1", sharding_key="k").seq == 1
        assert outbox.send(session, "t", b"2", sharding_key="k").seq == 2
    with sqlite.sessions() as session:
        assert session.scalars(select(OutboxKey.sharding_key)).all() == []


def test_idle_key_rows_are_purged_and_numbering_goes_on_from_the_rows_left(pg: Db) -> None:
    db = pg  # SQLite writes no key lock rows (test above)
    _, outbox = app_with_outbox(db)
    with db.sessions() as session, session.begin():
        outbox.send(session, "t", b"1", sharding_key="busy")
        outbox.send(session, "t", b"x", sharding_key="idle")
    with db.sessions() as session, session.begin():  # as if the relay had sent "idle"'s row
        session.execute(
            OutboxMessage.__table__.delete().where(OutboxMessage.sharding_key == "idle")
        )
    old = utcnow() - timedelta(hours=2)
    with db.sessions() as session, session.begin():
        session.execute(OutboxKey.__table__.update().values(used_at=old))
    assert purge_idle_keys(db.sessions, GROUP, idle_for=timedelta(hours=1)) == 1
    with db.sessions() as session:
        assert session.scalars(select(OutboxKey.sharding_key)).all() == ["busy"]
    # "busy" keeps its rows' order even though its lock row could go too
    assert purge_idle_keys(db.sessions, GROUP, idle_for=timedelta(0)) == 0
    with db.sessions() as session, session.begin():
        session.execute(OutboxKey.__table__.delete())
    with db.sessions() as session, session.begin():
        assert outbox.send(session, "t", b"2", sharding_key="busy").seq == 2
        assert outbox.send(session, "t", b"y", sharding_key="idle").seq == 1


def test_add_outbox_is_declared_once_keyword_only_before_start(db: Db) -> None:
    app = TxMsg(TxMsgConfig(), backend="rocketmq")
    outbox = app.add_outbox(group=GROUP, session_factory=db.sessions)
    assert app.outboxes == {GROUP: outbox}
    assert GROUP in app.registry.producer_groups  # the relay's producer starts with the app
    quiet = app.add_outbox(group="writer-only", session_factory=db.sessions, relay=False)
    assert "writer-only" not in app.registry.producer_groups
    assert not quiet.relay_in_process
    with pytest.raises(ListenerDefinitionError, match="already"):
        app.add_outbox(group=GROUP, session_factory=db.sessions)
    with pytest.raises(InvalidNameError):
        app.add_outbox(group="no spaces", session_factory=db.sessions)
    with pytest.raises(TypeError):
        app.add_outbox(GROUP, db.sessions)  # type: ignore[misc]
    for bad in ({"poll_interval": 0}, {"batch_size": 0}, {"lease": 1.0, "poll_interval": 1.0}):
        with pytest.raises(ConfigError):
            app.add_outbox(group="other", session_factory=db.sessions, **bad)  # type: ignore[arg-type]
    with pytest.raises(ListenerDefinitionError, match="OutboxDeadEvent"):
        app.on_outbox_dead(42)  # type: ignore[type-var]
    app.close()
    with pytest.raises(LifecycleError):
        app.add_outbox(group="late", session_factory=db.sessions)


def test_add_outbox_takes_every_option_of_outbox(db: Db) -> None:
    from inspect import signature  # noqa: PLC0415 - the module imports SQLAlchemy's inspect

    app = TxMsg(TxMsgConfig(), backend="rocketmq")
    own = list(signature(app.add_outbox).parameters.values())
    assert own == list(signature(Outbox).parameters.values())
    outbox = app.add_outbox(group=GROUP, session_factory=db.sessions, send_timeout=2.5)
    assert outbox.send_timeout == 2.5
    app.close()


def test_a_session_that_wrote_rows_wakes_the_relay_on_commit_only(db: Db) -> None:
    _, outbox = app_with_outbox(db)
    woken: list[str] = []

    class Probe:
        def wake(self) -> None:
            woken.append("wake")

        def delete_sent_in(self, session: object) -> None:
            pass  # a relay without sent rows

        state = "running"

    outbox._relay = Probe()  # type: ignore[assignment]  # only wake() and delete_sent_in()
    with pytest.raises(RuntimeError, match="fails"):
        roll_back(db, lambda session: outbox.send(session, "t", b"x"))
    with db.sessions() as session, session.begin():
        session.add(Order(ref="no outbox row"))
    assert woken == []
    session = db.sessions()
    with session.begin():
        outbox.send(session, "t", b"x")
    with session.begin():  # the same session's next transaction wrote no row
        session.add(Order(ref="later"))
    session.close()
    assert woken == ["wake"]
    outbox._relay = None


def test_a_scoped_session_writes_in_its_current_session(db: Db) -> None:
    _, outbox = app_with_outbox(db)
    scoped = scoped_session(db.sessions)
    try:
        with scoped.begin():
            scoped.add(Order(ref="scoped"))
            outbox.send(scoped, "t", b"x", sharding_key="k")
    finally:
        scoped.remove()
    assert [r.body for r in outbox_rows(db.sessions)] == [b"x"]


def test_the_row_is_typed_as_documented(db: Db) -> None:
    _, outbox = app_with_outbox(db)
    with db.sessions() as session, session.begin():
        outbox.send(session, "t", "é", sharding_key="k")
    (row,) = outbox_rows(db.sessions)
    assert isinstance(row, OutboxMessage)
    assert row.created_at.tzinfo is not None
    assert row.next_attempt_at == row.created_at
    assert row.body == "é".encode()
