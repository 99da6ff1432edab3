"""Parked keys of orderly listeners on SQLite and PostgreSQL: the park-behind / unpark protocol
under concurrency, replay (order, exactly-once with idempotent=True, stop at the first failure)
and discard."""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from txmsg.consumer import ConsumerSpec, build_consumer_spec
from txmsg.message import UNIQ_KEY, Message
from txmsg.sqla import consumed_count, discard, parked_keys, parked_messages, replay
from txmsg.sqla.models import ParkedKey, ParkedMessage, utcnow
from txmsg.sqla.parking import _insert_once, is_parked, park, park_behind

from .business import Ledger, ledger_rows
from .conftest import Db

GROUP = "refund-consumer"
TOPIC = "after-sales"


def msg(uid: str, key: str = "order-1") -> Message:
    return Message(
        topic=TOPIC,
        body=uid.encode(),
        properties={UNIQ_KEY: uid},
        message_id=f"id-{uid}",
        sharding_key=key,
    )


class Listener:
    """Records the order it applied messages in; fails on ``poison`` while ``broken``."""

    def __init__(self, poison: set[str]) -> None:
        self.poison = poison
        self.broken = True
        self.applied: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        uid = message.properties[UNIQ_KEY]
        if self.broken and uid in self.poison:
            raise RuntimeError(f"{uid} is poison")
        time.sleep(0.0005)  # widen the window between the check and the effect
        with self._lock:
            self.applied.append(uid)


def orderly_spec(fn: Any, db: Db, *, idempotent: bool = False) -> ConsumerSpec:
    return build_consumer_spec(
        fn,
        topic=TOPIC,
        group=GROUP,
        orderly=True,
        max_orderly_retries=1,
        orderly_retry_delay=0,
        idempotent=idempotent,
        session_factory=db.sessions,
    )


def apply_ledger(message: Message, session: Session) -> None:
    uid = message.properties[UNIQ_KEY]
    session.add(Ledger(message_key=uid, amount=1))
    if uid.startswith("bad"):
        raise ValueError(f"{uid}: liability not decided")


def test_is_parked_and_park_behind_answer_the_same_through_any_session_factory(db: Db) -> None:
    """The check takes the engine's pool directly for a bound sessionmaker (it runs before every
    orderly message) and a session for any other factory: both must see the same rows."""

    def plain_factory() -> Session:
        return db.sessions()

    for factory in (db.sessions, plain_factory):
        assert is_parked(factory, GROUP, "order-1") is False
    park(db.sessions, GROUP, msg("a"), error="E: boom", attempts=3)
    for factory in (db.sessions, plain_factory):
        assert is_parked(factory, GROUP, "order-1") is True
        assert is_parked(factory, GROUP, "order-2") is False
        assert is_parked(factory, "other-group", "order-1") is False
    # park-behind also takes the engine for a bound sessionmaker: same rows, same answers
    assert park_behind(db.sessions, GROUP, msg("b")) is True
    assert park_behind(plain_factory, GROUP, msg("c")) is True
    assert park_behind(plain_factory, GROUP, msg("b")) is True  # redelivery: no second row
    assert park_behind(db.sessions, GROUP, msg("c")) is True
    assert park_behind(db.sessions, GROUP, msg("d", key="order-2")) is False
    assert park_behind(plain_factory, GROUP, msg("d", key="order-2")) is False
    assert [
        v.message.properties[UNIQ_KEY] for v in parked_messages(db.sessions, GROUP, "order-1")
    ] == ["a", "b", "c"]


def test_park_behind_needs_a_parked_key(db: Db) -> None:
    assert park_behind(db.sessions, GROUP, msg("a")) is False
    park(db.sessions, GROUP, msg("a"), error="E: boom", attempts=3)
    assert park_behind(db.sessions, GROUP, msg("b")) is True
    assert park_behind(db.sessions, GROUP, msg("b")) is True  # redelivery: still one row
    assert park_behind(db.sessions, "other-group", msg("c")) is False
    assert [r.message_key for r in parked_messages(db.sessions, GROUP, "order-1")] == ["a", "b"]
    (key,) = parked_keys(db.sessions, GROUP)
    assert key.messages == 2
    assert parked_keys(db.sessions, "other-group") == []


def test_concurrent_park_behind_and_replay_lose_and_reorder_nothing(db: Db) -> None:
    """The consumer keeps receiving messages of a parked key while an operator replays it over
    and over: every message is applied exactly once, in the order the queue delivered them."""
    listener = Listener(poison={"m000"})
    spec = orderly_spec(listener, db)
    handle = spec.safe_handler()
    uids = [f"m{i:03d}" for i in range(80)]
    assert handle(msg(uids[0])) is True  # poison: the key is parked
    assert handle(msg(uids[1])) is True  # parked behind it: the first replay has two to apply
    listener.broken = False  # the cause is fixed
    consumer_done = threading.Event()
    failures: list[BaseException] = []

    def consume() -> None:
        try:
            for uid in uids[2:]:
                while not handle(msg(uid)):  # False = the backend hands the same message again
                    time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported below  # pragma: no cover
            failures.append(exc)
        finally:
            consumer_done.set()

    replayed: list[int] = []

    def replay_repeatedly() -> None:
        try:
            while not consumer_done.is_set():
                report = replay(spec, db.sessions, GROUP, "order-1")
                assert report.ok
                replayed.append(report.replayed)
                time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001 - reported below  # pragma: no cover
            failures.append(exc)

    threads = [threading.Thread(target=consume), threading.Thread(target=replay_repeatedly)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures
    assert replay(spec, db.sessions, GROUP).ok  # whatever was parked last
    assert listener.applied == uids
    assert parked_keys(db.sessions) == []
    assert sum(replayed) >= 2  # the poison message and at least one parked behind it


def test_replay_through_the_idempotent_listener_is_exactly_once(db: Db) -> None:
    spec = orderly_spec(apply_ledger, db, idempotent=True)
    handle = spec.safe_handler()
    assert handle(msg("bad-1")) is True  # parked
    for uid in ("a", "b", "c"):
        assert handle(msg(uid)) is True  # parked behind
    # "a" was applied once already (say by a replay that died before deleting its row)
    spec.handler(msg("a"))
    # the cause is fixed: a new release of the listener, same group and database
    fixed = orderly_spec(
        lambda m, s: s.add(Ledger(message_key=m.properties[UNIQ_KEY], amount=1)),
        db,
        idempotent=True,
    )
    # two operators replay at the same moment
    reports: list[Any] = []
    barrier = threading.Barrier(2)

    def run() -> None:
        barrier.wait(10)
        reports.append(replay(fixed, db.sessions, GROUP, "order-1"))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(reports) == 2
    assert all(r.ok for r in reports)
    assert ledger_rows(db.sessions) == [("a", 1), ("bad-1", 1), ("b", 1), ("c", 1)]
    assert consumed_count(db.sessions, GROUP) == 4
    assert parked_keys(db.sessions) == []
    with db.sessions() as session:
        assert session.scalars(select(ParkedMessage)).all() == []


def test_replay_stops_a_key_at_its_first_failure_and_goes_on_with_other_keys(db: Db) -> None:
    spec = orderly_spec(apply_ledger, db, idempotent=True)
    handle = spec.safe_handler()
    for m in (msg("bad-1", "o1"), msg("x", "o1"), msg("bad-2", "o2"), msg("y", "o2")):
        assert handle(m) is True
    assert [k.sharding_key for k in parked_keys(db.sessions, GROUP)] == ["o1", "o2"]

    def fixed_for_bad_1(message: Message, session: Session) -> None:
        uid = message.properties[UNIQ_KEY]
        session.add(Ledger(message_key=uid, amount=1))
        if uid == "bad-2":
            raise ValueError("bad-2: still broken")

    report = replay(orderly_spec(fixed_for_bad_1, db, idempotent=True), db.sessions, GROUP)
    assert not report.ok
    by_key = {k.sharding_key: k for k in report.keys}
    assert (by_key["o1"].replayed, by_key["o1"].unparked, by_key["o1"].error) == (2, True, None)
    assert (by_key["o2"].replayed, by_key["o2"].unparked) == (0, False)
    assert by_key["o2"].failed_message_key == "bad-2"
    assert by_key["o2"].error == "ValueError: bad-2: still broken"
    assert report.replayed == 2
    assert ledger_rows(db.sessions) == [("bad-1", 1), ("x", 1)]  # bad-2's insert rolled back

    (still,) = parked_keys(db.sessions, GROUP)
    assert (still.sharding_key, still.messages, still.reason) == (
        "o2",
        2,
        "ValueError: bad-2: still broken",
    )
    rows = parked_messages(db.sessions, GROUP, "o2")
    assert [(r.message_key, r.attempts) for r in rows] == [("bad-2", 2), ("y", 0)]
    # o1 is released: its next message is handled live again
    assert handle(msg("z", "o1")) is True
    assert ledger_rows(db.sessions)[-1] == ("z", 1)


def test_replay_of_a_plain_handler_and_of_nothing(db: Db) -> None:
    listener = Listener(poison={"p"})
    handle = orderly_spec(listener, db).safe_handler()
    assert handle(msg("p")) is True
    assert handle(msg("q")) is True
    listener.broken = False
    report = replay(listener, db.sessions, GROUP)  # a bare handler works too
    assert (report.ok, report.replayed, listener.applied) == (True, 2, ["p", "q"])
    empty = replay(listener, db.sessions, GROUP)
    assert (empty.ok, empty.keys) == (True, [])


def test_discard_one_message_then_the_rest(db: Db) -> None:
    handle = orderly_spec(Listener(poison={"p"}), db).safe_handler()
    for uid in ("p", "q", "r"):
        assert handle(msg(uid)) is True
    assert discard(db.sessions, GROUP, "order-1", message_key="p") == 1
    assert discard(db.sessions, GROUP, "order-1", message_key="nope") == 0
    assert [r.message_key for r in parked_messages(db.sessions, GROUP, "order-1")] == ["q", "r"]
    assert parked_keys(db.sessions)[0].messages == 2
    assert discard(db.sessions, GROUP, "order-1") == 2
    assert parked_keys(db.sessions) == []  # released with its last message
    assert discard(db.sessions, GROUP, "order-1") == 0


def test_parked_keys_lists_oldest_first_across_groups(db: Db) -> None:
    for i in range(3):
        park(db.sessions, f"g{i % 2}", msg(f"u{i}", f"k{i}"), error="E: x", attempts=1)
        time.sleep(0.002)  # distinct parked_at
    assert [(k.group, k.sharding_key) for k in parked_keys(db.sessions)] == [
        ("g0", "k0"),
        ("g1", "k1"),
        ("g0", "k2"),
    ]
    assert [k.sharding_key for k in parked_keys(db.sessions, "g0")] == ["k0", "k2"]


def test_insert_once_says_whether_it_inserted(db: Db) -> None:
    # park() re-locks the key row when this says "already there"; psycopg reports rowcount -1
    # for INSERT ... ON CONFLICT DO NOTHING, so the answer must not come from the rowcount
    values: dict[str, Any] = dict(
        consumer_group=GROUP,
        sharding_key="k",
        topic=TOPIC,
        reason="r",
        first_message_id="m",
        parked_at=utcnow(),
    )
    with db.sessions() as session, session.begin():
        assert _insert_once(session, ParkedKey, values) is True
        assert _insert_once(session, ParkedKey, values) is False
    with db.engine.begin() as connection:
        assert _insert_once(connection, ParkedKey, values | {"sharding_key": "k2"}) is True
        assert _insert_once(connection, ParkedKey, values | {"sharding_key": "k2"}) is False
