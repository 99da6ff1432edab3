"""The chaos checker must catch each kind of inconsistency it claims to (else a green chaos run
proves nothing).  A consistent world is built with the sample's real code, then broken one way at
a time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from benchmarks.chaos import check
from benchmarks.chaos.databases import (
    close_all,
    finish_attempt,
    open_all,
    prepare,
    start_attempt,
)
from benchmarks.chaos.roles import fault_of
from benchmarks.chaos.settings import ChaosSettings
from samples.order import cart, logistics, points
from samples.order.events import TOPIC
from samples.order.keys import ORDER_GROUP
from samples.order.orders import Order, create_order, mark_paid, order_paid_event
from txmsg.message import UNIQ_KEY, Message
from txmsg.sqla import RecordState, TransactionRecord, wrap_idempotent
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
