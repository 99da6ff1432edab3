"""The chaos checker must catch each kind of inconsistency it claims to (else a green chaos run
proves nothing).  A consistent world is built with the sample's real code, then broken one way at
a time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker
from txmsg_samples.order import cart, logistics, points
from txmsg_samples.order.events import TOPIC
from txmsg_samples.order.keys import ORDER_GROUP
from txmsg_samples.order.orders import Order, create_order, mark_paid, order_paid_event

from benchmarks.chaos import check, tracking
from benchmarks.chaos.databases import (
    close_all,
    finish_attempt,
    open_all,
    prepare,
    start_attempt,
)
from benchmarks.chaos.roles import fault_of
from benchmarks.chaos.settings import ChaosSettings
from txmsg.message import UNIQ_KEY, Message
from txmsg.sqla import RecordState, TransactionRecord, parking, wrap_idempotent
from txmsg.sqla.journal import InflightJournal
from txmsg.sqla.models import utcnow

HANDLERS = {
    "points": points.on_order_paid,
    "logistics": logistics.on_order_paid,
    "cart": cart.on_order_paid,
}


@dataclass
class World:
    dbs: dict[str, sessionmaker[Session]]
    settings: ChaosSettings

    def order(self, oid: str, user: str = "u1", amount: int = 1234) -> None:
        skus = [f"{oid}-a", f"{oid}-b"]
        with self.dbs["cart"]() as s, s.begin():
            for sku in skus:
                cart.add_to_cart(s, user, sku)
        with self.dbs["orders"]() as s, s.begin():
            create_order(s, oid, user, amount, skus)

    def pay(self, oid: str, outcome: str = "COMMIT", state: str = "COMMITTED") -> str:
        key = f"key-{oid}"
        attempt = start_attempt(self.dbs["orders"], oid, "producer-0")
        with self.dbs["orders"]() as s, s.begin():
            if state == RecordState.COMMITTED.value:
                mark_paid(s, oid, key)
            now = utcnow()
            s.add(
                TransactionRecord(
                    transaction_key=key,
                    producer_group=ORDER_GROUP,
                    topic=TOPIC,
                    state=state,
                    created_at=now,
                    updated_at=now,
                )
            )
        finish_attempt(self.dbs["orders"], attempt, outcome)
        return key

    def deliver(
        self, oid: str, services: tuple[str, ...] = ("points", "logistics", "cart")
    ) -> None:
        with self.dbs["orders"]() as s:
            order = s.get(Order, oid)
            assert order is not None
            body = order_paid_event(order).to_json()
        message = Message(topic=TOPIC, body=body, properties={UNIQ_KEY: f"key-{oid}"})
        for service in services:
            group = check.SERVICE_GROUPS[service]
            wrap_idempotent(HANDLERS[service], self.dbs[service], group, TOPIC)(message)

    def verify(self) -> list[str]:
        return check.verify(self.dbs, self.settings).violations


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    urls = prepare(tmp_path, None)
    settings = ChaosSettings(workdir=tmp_path, database_urls=urls, fail_rate=0.0)
    dbs = open_all(urls)
    w = World(dbs, settings)
    for oid in ("o1", "o2", "o3"):
        w.order(oid)
    w.pay("o1")
    w.deliver("o1")
    w.deliver("o1")  # a duplicate delivery, absorbed
    w.pay("o2", outcome="UNKNOW")  # in doubt for the producer, committed in the database
    w.deliver("o2")
    w.pay("o3", outcome="ROLLBACK", state="ROLLED_BACK")
    yield w
    close_all(dbs)


def test_a_consistent_world_has_no_violations(world: World) -> None:
    assert world.verify() == []
    snap = check.snapshot(world.dbs)
    assert snap.paid == {"o1", "o2"}
    assert snap.acked == {"o1"}
    assert snap.in_doubt == {"o2"}
    assert snap.rolled_back == {"o3"}
    assert snap.duplicates == {"points": 1, "logistics": 1, "cart": 1}
    assert snap.caught_up


def test_rolled_back_order_processed_is_caught(world: World) -> None:
    world.deliver("o3", ("points",))
    bad = world.verify()
    assert "order o3: not PAID but points processed it" in bad
    assert any("outside [committed 1, committed + in doubt 2]" in line for line in bad)


def test_committed_order_never_processed_is_caught(world: World) -> None:
    world.order("o4")
    world.pay("o4")
    world.deliver("o4", ("points", "logistics"))
    bad = world.verify()
    assert "order o4: PAID but cart never processed it" in bad
    assert "order o4: PAID but o4-a is still in the cart" in bad
    assert not check.snapshot(world.dbs).caught_up


def test_second_effect_is_caught(world: World) -> None:
    with world.dbs["points"]() as s, s.begin():
        s.execute(update(points.PointsBalance).values(points=points.PointsBalance.points + 12))
    assert any(line.startswith("user u1:") for line in world.verify())


def test_unresolved_in_flight_record_is_caught(world: World) -> None:
    world.order("o5")
    world.pay("o5", outcome="UNKNOW", state="IN_FLIGHT")
    assert "record key-o5: still IN_FLIGHT after the run settled (never resolved)" in world.verify()


def test_commit_told_but_not_paid_is_caught(world: World) -> None:
    world.order("o6")
    world.pay("o6", outcome="COMMIT", state="ROLLED_BACK")
    assert "order o6: the producer was told COMMIT but the order is not PAID" in world.verify()


def test_planned_failure_paid_is_caught(tmp_path: Path, world: World) -> None:
    failing = next(
        f"f{i}"
        for i in range(10_000)
        if fault_of(world.settings.model_copy(update={"fail_rate": 0.5}), f"f{i}")[0] == "fail"
    )
    world.settings = world.settings.model_copy(update={"fail_rate": 0.5})
    world.order(failing)
    world.pay(failing)
    world.deliver(failing)
    assert f"order {failing}: its local transaction always fails, yet it is PAID" in world.verify()


# ---- the ordered stream (benchmarks.chaos.tracking) -----------------------------------------------
def _sent(world: World, oid: str, seq: int, outcomes: tuple[str | None, ...] = ("OK",)) -> None:
    """Journal send attempts of event ``seq`` of ``oid`` as the producer does."""
    for outcome in outcomes:
        row = tracking._journal(world.dbs["orders"], oid, seq, "producer-0")
        if outcome is not None:
            tracking._finish(world.dbs["orders"], row, outcome)


def _consume(world: World, oid: str, seq: int, message_id: str, key: str | None = None) -> None:
    """Hand one message to the tracking listener exactly as the orderly consumer does (through the
    idempotent wrapper, which absorbs a redelivery of the same message id)."""
    body = json.dumps({"order_id": oid, "seq": seq, "event": tracking.EVENTS[seq]}).encode()
    message = Message(
        topic=tracking.TOPIC,
        body=body,
        properties={UNIQ_KEY: message_id},
        message_id=message_id,
        sharding_key=oid if key is None else key,
    )
    wrap_idempotent(tracking.on_order_event, world.dbs["tracking"], tracking.GROUP, tracking.TOPIC)(
        message
    )


@pytest.fixture
def streamed(world: World) -> World:
    """o1's three events acknowledged and applied in order; event 1 of o1 sent twice (the first
    attempt's answer was lost) and both copies delivered; event 0 redelivered; o2's event 1 in
    doubt (its producer died) and not applied."""
    _sent(world, "o1", 0)
    _sent(world, "o1", 1, ("ERROR", "OK"))
    _sent(world, "o1", 2)
    _consume(world, "o1", 0, "m0")
    _consume(world, "o1", 0, "m0")  # redelivered after a consumer kill: absorbed
    _consume(world, "o1", 1, "m1a")
    _consume(world, "o1", 1, "m1b")  # the resend: skipped
    _consume(world, "o1", 2, "m2")
    _sent(world, "o2", 0)
    _sent(world, "o2", 1, (None,))
    _consume(world, "o2", 0, "n0")
    return world


def test_a_consistent_stream_has_no_violations(streamed: World) -> None:
    assert streamed.verify() == []
    snap = check.snapshot(streamed.dbs)
    assert snap.stream.acked == {("o1", 0), ("o1", 1), ("o1", 2), ("o2", 0)}
    assert snap.stream.in_doubt == {("o2", 1)}
    assert snap.stream.skipped == [("o1", 1)]
    assert snap.stream_duplicates == 1
    assert snap.caught_up


def test_event_applied_before_an_earlier_one_is_caught(streamed: World) -> None:
    _sent(streamed, "o3", 0)
    _sent(streamed, "o3", 1)
    _consume(streamed, "o3", 1, "p1")
    _consume(streamed, "o3", 0, "p0")
    assert "order o3: events applied in the order [1, 0] (expected 0, 1, 2... without gaps)" in (
        streamed.verify()
    )


def test_acknowledged_event_never_applied_is_caught(streamed: World) -> None:
    _sent(streamed, "o2", 1)
    bad = streamed.verify()
    assert "order o2: event 1 was acknowledged to the sender but never applied" in bad
    assert not check.snapshot(streamed.dbs).caught_up


def test_gap_is_caught(streamed: World) -> None:
    _sent(streamed, "o2", 1)
    _sent(streamed, "o2", 2)
    _consume(streamed, "o2", 2, "n2")
    assert any(
        line.startswith("order o2: events applied in the order [0, 2]")
        for line in streamed.verify()
    )


def test_event_applied_twice_is_caught(streamed: World) -> None:
    with streamed.dbs["tracking"]() as s, s.begin():
        s.add(
            tracking.OrderEvent(
                order_id="o2", seq=0, event="paid", sharding_key="o2", applied_at=utcnow()
            )
        )
    bad = streamed.verify()
    assert any(line.startswith("order o2: an event applied twice") for line in bad)


def test_second_copy_of_a_single_send_is_caught(streamed: World) -> None:
    _consume(streamed, "o2", 0, "n0-again")  # a second message for an event sent once
    assert any(
        line.startswith("order o2: event 0 was sent once but a second copy")
        for line in streamed.verify()
    )


def test_event_never_sent_and_wrong_key_are_caught(streamed: World) -> None:
    _consume(streamed, "o2", 1, "n1", key="o1")
    _sent(streamed, "o4", 0)
    _consume(streamed, "o4", 0, "q0")
    _consume(streamed, "o4", 1, "q1")
    bad = streamed.verify()
    assert "order o2: the listener saw sharding key(s) ['o1', 'o2']" in bad
    assert "order o4: event 1 applied but never sent" in bad
    assert "order o4: events sent for an order that is not PAID" in bad


def test_parked_key_is_caught(streamed: World) -> None:
    message = Message(
        topic=tracking.TOPIC,
        body=b"{}",
        properties={UNIQ_KEY: "z"},
        message_id="z",
        sharding_key="o2",
    )
    parking.park(streamed.dbs["tracking"], tracking.GROUP, message, error="boom", attempts=3)
    assert any(
        line.startswith("key 'o2' of tracking-service is parked with 1 message(s)")
        for line in streamed.verify()
    )


def test_unfinished_inflight_row_is_caught_and_blocks_settling(
    streamed: World, tmp_path: Path
) -> None:
    message = Message(
        topic=tracking.TOPIC,
        body=b"{}",
        properties={UNIQ_KEY: "w"},
        message_id="w",
        sharding_key="o2",
    )
    journal = InflightJournal(streamed.dbs["tracking"], tracking.GROUP)
    journal.owner = "gone-host:1:killed"  # what a killed consumer leaves
    assert journal.enter(message).row_id is not None
    assert "1 in-flight journal row(s) of tracking-service never finished" in " ".join(
        streamed.verify()
    )
    assert not check.snapshot(streamed.dbs).caught_up

    logs = tmp_path / "logs"
    logs.mkdir()
    line = "x WARNING group=tracking-service: finishing row 7 {} a:1:b (gone), {}; see ...\n"
    (logs / "tracking-0.log").write_text(
        line.format(tracking.RECOVERED_MARK, "by the sweeper")
        + "other\n"
        + line.format(tracking.RECOVERED_MARK, "handed again")
    )
    (logs / "tracking-1.log").write_text(line.format(tracking.RECOVERED_MARK, "by the sweeper"))
    (logs / "points-0.log").write_text(
        line.format(tracking.RECOVERED_MARK, "handed again")
    )  # not tracking
    assert tracking.recovered_in(logs) == {
        "handed again": 1,
        "before the key's next message": 0,
        "by the sweeper": 2,
    }
