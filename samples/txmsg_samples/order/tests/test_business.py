"""The order sample's business logic on its own: no broker, real SQLite databases."""

from __future__ import annotations

from typing import Any

import pytest

from txmsg.message import UNIQ_KEY, Message
from txmsg.sqla import RecordState, get_record, wrap_idempotent
from txmsg.states import LocalTransactionState as S
from txmsg_samples.order import cart, logistics, points
from txmsg_samples.order.events import TOPIC, OrderPaid
from txmsg_samples.order.orders import (
    CREATED,
    PAID,
    Order,
    OrderNotFound,
    OrderNotPayable,
    OrderService,
    PaymentListener,
    create_order,
)

from .conftest import Dbs, InlinePublisher


def seed(dbs: Dbs, order_id: str = "o-1", user: str = "u-1", amount: int = 1250) -> OrderPaid:
    skus = [f"{order_id}-a", f"{order_id}-b"]
    with dbs.orders() as session, session.begin():
        create_order(session, order_id, user, amount, skus)
    with dbs.cart() as session, session.begin():
        for sku in [*skus, "keep-me"]:
            cart.add_to_cart(session, user, sku)
    return OrderPaid(order_id, user, amount, skus)


def test_pay_marks_paid_and_publishes_once(dbs: Dbs) -> None:
    seed(dbs)
    publisher = InlinePublisher(PaymentListener(dbs.orders))
    service = OrderService(publisher, dbs.orders)
    assert service.pay("o-1") is S.COMMIT
    assert service.status("o-1") == PAID
    (msg,) = publisher.committed
    assert msg.topic == TOPIC
    assert OrderPaid.from_message(msg) == OrderPaid("o-1", "u-1", 1250, ["o-1-a", "o-1-b"])
    record = get_record(dbs.orders, msg.transaction_key or "")
    assert record is not None
    assert record.state is RecordState.COMMITTED
    with dbs.orders() as session:
        order = session.get(Order, "o-1")
        assert order is not None
        assert order.paid_by_message == msg.transaction_key
    with pytest.raises(OrderNotPayable):
        service.pay("o-1")
    with pytest.raises(OrderNotFound):
        service.pay("nope")


def test_race_to_pay_twice_commits_only_one(dbs: Dbs) -> None:
    """Both payments passed the pre-check; the second local transaction finds the order PAID,
    rolls back, and its event is never delivered."""
    seed(dbs)
    listener = PaymentListener(dbs.orders)
    first = Message(topic=TOPIC, body=b"{}", properties={UNIQ_KEY: "k1"})
    second = Message(topic=TOPIC, body=b"{}", properties={UNIQ_KEY: "k2"})
    assert listener.execute_local(first, "o-1") is S.COMMIT
    assert listener.execute_local(second, "o-1") is S.ROLLBACK
    assert listener.check_local(second) is S.ROLLBACK
    assert listener.check_local(first) is S.COMMIT


def test_failing_local_transaction_leaves_order_unpaid(dbs: Dbs) -> None:
    seed(dbs)

    class Failing(PaymentListener):
        def execute_in_transaction(self, session: Any, message: Message, arg: Any) -> None:
            super().execute_in_transaction(session, message, arg)
            session.flush()
            raise RuntimeError("ledger down")

    publisher = InlinePublisher(Failing(dbs.orders))
    assert OrderService(publisher, dbs.orders).pay("o-1") is S.ROLLBACK
    assert OrderService(publisher, dbs.orders).status("o-1") == CREATED
    assert publisher.committed == []


def test_consumers_apply_once_each_in_their_own_database(dbs: Dbs) -> None:
    event = seed(dbs, amount=1999)
    msg = Message(topic=TOPIC, body=event.to_json(), properties={UNIQ_KEY: "paid-1"})
    consumers = [
        wrap_idempotent(points.on_order_paid, dbs.points, points.GROUP, TOPIC),
        wrap_idempotent(logistics.on_order_paid, dbs.logistics, logistics.GROUP, TOPIC),
        wrap_idempotent(cart.on_order_paid, dbs.cart, cart.GROUP, TOPIC),
    ]
    for _ in range(3):  # first delivery + two duplicates
        for consumer in consumers:
            consumer(msg)
    assert [c.duplicates for c in consumers] == [2, 2, 2]
    with dbs.points() as s:
        assert points.entries(s) == {"o-1": 19}
        assert points.total_balance(s) == 19
    with dbs.logistics() as s:
        assert logistics.shipments(s) == {"o-1": "o-1-a,o-1-b"}
    with dbs.cart() as s:
        assert cart.items(s) == {("u-1", "keep-me")}
        assert cart.checkouts(s) == {"o-1": 2}


def test_malformed_event_is_rejected_without_effects(dbs: Dbs) -> None:
    consumer = wrap_idempotent(points.on_order_paid, dbs.points, points.GROUP, TOPIC)
    with pytest.raises(ValueError, match="not an OrderPaid"):
        consumer(Message(topic=TOPIC, body=b"[1,2]", properties={UNIQ_KEY: "bad"}))
    with dbs.points() as s:
        assert points.entries(s) == {}
    consumer(
        Message(
            topic=TOPIC, body=OrderPaid("o-9", "u", 300).to_json(), properties={UNIQ_KEY: "bad2"}
        )
    )
    with dbs.points() as s:
        assert points.entries(s) == {"o-9": 3}


def test_create_order_validates_amount(dbs: Dbs) -> None:
    with dbs.orders() as session, pytest.raises(ValueError, match="must be positive"):
        create_order(session, "o-x", "u", 0, [])
