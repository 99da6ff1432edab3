"""Issue 25: on SQLite the relay's thread takes no write lock in its steady state - the rows it sent
are deleted by the next writer's transaction of its process (which holds the lock anyway), or by
the relay itself when no writer comes (txmsg/sqla/outbox/ledger.py).  Sent rows are never sent
again while their deletion is pending, a rolled-back writer leaves them to the next one, a key's
order holds, and a closing relay deletes what is left."""

from __future__ import annotations

import time

import pytest
from outbox_kit import Order, ScriptedSender, outbox_rows, scripted_producer
from txmsg_broker.testing import wait_until

import txmsg.sqla.outbox.claims as claims_module
import txmsg.sqla.outbox.ledger as ledger_module
from conftest import Db
from txmsg.sqla import create_engine, make_session_factory
from txmsg.sqla.outbox import Outbox
from txmsg.sqla.outbox.ledger import SentLedger

GROUP = "ledger-outbox"


def keys_left(db: Db) -> list[str]:
    return sorted(r.sharding_key or "" for r in outbox_rows(db.sessions))


def bodies_left(db: Db) -> list[bytes]:
    return sorted(r.body for r in outbox_rows(db.sessions))


@pytest.fixture
def quiet_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay never deletes its sent rows itself (only writers and its close do)."""
    monkeypatch.setattr(claims_module, "SELF_DELETE_AFTER", 3600.0)
    monkeypatch.setattr(claims_module, "SELF_DELETE_AT", 10**9)


def started(db: Db, sender: ScriptedSender) -> Outbox:
    outbox = Outbox(group=GROUP, session_factory=db.sessions, poll_interval=0.05, lease=300.0)
    outbox.start_relay(scripted_producer(sender))
    return outbox


def ledger_of(outbox: Outbox) -> SentLedger:
    relay = outbox.relay
    assert relay is not None
    assert relay.claims is not None
    assert relay.claims.ledger is not None
    return relay.claims.ledger


def sent_and_pending(sender: ScriptedSender, ledger: SentLedger, sends: int) -> bool:
    """``sends`` sent, and the relay has put the last one's deletion in its ledger (it does after
    the send returns: a test that goes on at the send alone can find the ledger still empty, as a
    loaded soak run did)."""
    return len(sender.sent) == sends and ledger.has_free()


def write(outbox: Outbox, db: Db, key: str | None, body: str) -> None:
    with db.sessions() as session, session.begin():
        outbox.send(session, "t", body, sharding_key=key)


def test_the_next_writers_transaction_deletes_what_the_relay_sent(
    sqlite: Db, quiet_relay: None
) -> None:
    sender = ScriptedSender()
    outbox = started(sqlite, sender)
    try:
        # one transaction: with one each, the relay could send a1 before a2's transaction, which
        # then deletes it (as it should), and the three are never pending together
        with sqlite.sessions() as session, session.begin():
            outbox.send(session, "t", "a1", sharding_key="a")
            outbox.send(session, "t", "a2", sharding_key="a")
            outbox.send(session, "t", "p1")
        wait_until(lambda: len(sender.sent) == 3, timeout=30, message="three sends")
        # sent, deletion pending: still in the table, never sent again by the polling relay
        relay = outbox.relay
        assert relay is not None
        cycles = relay.stats().cycles
        wait_until(lambda: relay.stats().cycles >= cycles + 5, timeout=30, message="more polls")
        assert bodies_left(sqlite) == [b"a1", b"a2", b"p1"]
        assert len(sender.sent) == 3
        write(outbox, sqlite, "a", "a3")  # this transaction deletes the three
        assert bodies_left(sqlite) == [b"a3"]
        wait_until(lambda: len(sender.sent) == 4, timeout=30, message="a3 sent")
        assert [m.body for m in sender.sent if m.sharding_key == "a"] == [b"a1", b"a2", b"a3"]
    finally:
        outbox.stop_relay()
    assert bodies_left(sqlite) == []  # the closing relay deleted a3
    assert len(sender.sent) == 4


def test_a_rolled_back_writer_leaves_the_sent_rows_to_the_next_one(
    sqlite: Db, quiet_relay: None
) -> None:
    sender = ScriptedSender()
    outbox = started(sqlite, sender)
    ledger = ledger_of(outbox)
    try:
        write(outbox, sqlite, "a", "a1")
        wait_until(lambda: sent_and_pending(sender, ledger, 1), timeout=30, message="a1 sent")
        with sqlite.sessions() as session:
            session.begin()
            session.add(Order(ref="rolled back"))
            outbox.send(session, "t", "never", sharding_key="a")
            session.rollback()
        assert bodies_left(sqlite) == [b"a1"]  # its deletion went with the rollback
        assert ledger.has_free()
        write(outbox, sqlite, "b", "b1")
        assert bodies_left(sqlite) == [b"b1"]
        wait_until(lambda: len(sender.sent) == 2, timeout=30, message="b1 sent")
    finally:
        outbox.stop_relay()
    assert [m.body for m in sender.sent] == [b"a1", b"b1"]


def test_a_writer_in_a_savepoint_or_on_another_engine_deletes_nothing(
    sqlite: Db, quiet_relay: None
) -> None:
    sender = ScriptedSender()
    outbox = started(sqlite, sender)
    other = create_engine(sqlite.url)
    try:
        write(outbox, sqlite, "a", "a1")
        wait_until(lambda: len(sender.sent) == 1, timeout=30, message="a1 sent")
        with sqlite.sessions() as session, session.begin(), session.begin_nested():
            outbox.send(session, "t", "a2", sharding_key="a")
        with make_session_factory(other)() as session, session.begin():
            outbox.send(session, "t", "b1", sharding_key="b")
        wait_until(lambda: len(sender.sent) == 3, timeout=30, message="a2 and b1 sent")
        assert bodies_left(sqlite) == [b"a1", b"a2", b"b1"]
    finally:
        outbox.stop_relay()
        other.dispose()
    assert bodies_left(sqlite) == []
    assert [m.body for m in sender.sent if m.sharding_key == "a"] == [b"a1", b"a2"]


def test_without_writers_the_relay_deletes_its_sent_rows_itself(sqlite: Db) -> None:
    sender = ScriptedSender()
    outbox = started(sqlite, sender)
    try:
        for n in range(5):
            write(outbox, sqlite, f"k{n % 2}", f"m{n}")
        wait_until(lambda: len(sender.sent) == 5, timeout=30, message="five sends")
        wait_until(lambda: outbox_rows(sqlite.sessions) == [], timeout=30, message="deleted")
        time.sleep(0.3)  # several more polls: nothing sent twice
        assert len(sender.sent) == 5
        assert outbox.stats().unsent == 0
    finally:
        outbox.stop_relay()


def test_the_ledger_claims_releases_and_frees_stale_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = SentLedger()
    assert ledger.claim() is None
    assert not ledger.has_free()
    assert ledger.oldest_free() is None
    ledger.add(["k1", "k2"])
    claim = ledger.claim()
    assert claim is not None
    token, keys = claim
    assert sorted(keys) == ["k1", "k2"]
    assert not ledger.has_free()
    assert sorted(ledger.keys()) == ["k1", "k2"]  # still left out of the relay's reads
    ledger.add(["k3"])
    ledger.release(token)  # rolled back: to be deleted again
    assert sorted(ledger.keys()) == ["k1", "k2", "k3"]
    assert len(ledger) == 3
    claim = ledger.claim()
    assert claim is not None
    ledger.done(claim[0])  # committed
    assert ledger.keys() == []
    assert len(ledger) == 0
    ledger.add(["k4"])
    assert ledger.claim() is not None
    monkeypatch.setattr(ledger_module, "CLAIM_TIMEOUT", -1.0)  # a transaction that never ended
    again = ledger.claim()
    assert again is not None
    assert again[1] == ["k4"]
    ledger.done(again[0])
    assert len(ledger) == 0


def test_a_savepoint_neither_wakes_nor_completes_and_a_closed_session_hands_back(
    sqlite: Db, quiet_relay: None
) -> None:
    """A savepoint released or rolled back after ``outbox.send`` is not the commit: the
    deletion counts (and the relay wakes) only when the transaction itself commits; a session
    closed with its transaction open hands its deletion back."""
    sender = ScriptedSender()
    outbox = started(sqlite, sender)
    ledger = ledger_of(outbox)
    try:
        write(outbox, sqlite, "a", "a1")
        wait_until(lambda: sent_and_pending(sender, ledger, 1), timeout=30, message="a1 sent")
        session = sqlite.sessions()
        session.begin()
        outbox.send(session, "t", "a2", sharding_key="a")  # claims a1's deletion
        with session.begin_nested():
            session.add(Order(ref="in a savepoint"))
        try:
            with session.begin_nested():
                raise ValueError("rolled back savepoint")
        except ValueError:
            pass
        assert not ledger.has_free()
        assert len(ledger) == 1  # still claimed by the open transaction
        session.close()  # never committed: a1's deletion is handed back
        assert ledger.has_free()
        assert bodies_left(sqlite) == [b"a1"]
        with sqlite.sessions() as session, session.begin():
            outbox.send(session, "t", "a3", sharding_key="a")
            with session.begin_nested():
                session.add(Order(ref="released savepoint"))
            assert not ledger.has_free()  # claimed until the commit
            assert len(ledger) == 1
        assert bodies_left(sqlite) == [b"a3"]  # a1 deleted by that commit
        wait_until(lambda: len(sender.sent) == 2, timeout=30, message="a3 sent")
    finally:
        outbox.stop_relay()
    assert [m.body for m in sender.sent] == [b"a1", b"a3"]
