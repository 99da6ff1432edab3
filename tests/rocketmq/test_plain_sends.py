"""Plain sends through the app (``app.add_producer`` / ``app.producer(g).send...``) and orderly
listeners declared on the app, with the real client (librocketmq 2.1.0) against the embedded
broker: what a service writes, end to end.  The backend's own sender and orderly consumer are
tested in test_rmq_plain_sender.py and test_orderly_consumer.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rmq_helpers import create_topic, unique, wait_until

from txmsg import (
    InvalidMessageError,
    ListenerRegistry,
    LocalTransactionState,
    Message,
    ParkedEvent,
    TxMsg,
)
from txmsg.message import SHARDING_KEY
from txmsg.sqla import create_engine, create_tables, make_session_factory, parked_messages

S = LocalTransactionState


class Inbox:
    """Messages a listener received, with arrival times."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.got: list[tuple[float, Message]] = []

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.got.append((time.monotonic(), message))

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for _, m in self.got]

    def message(self, body: bytes) -> Message:
        with self.lock:
            return next(m for _, m in self.got if m.body == body)

    def arrival(self, body: bytes) -> float:
        with self.lock:
            return next(t for t, m in self.got if m.body == body)


def test_every_send_kind_of_a_plain_group_arrives(
    make_app: Callable[[], TxMsg], txmsg_broker: Any
) -> None:
    topic = unique("plain_topic")
    create_topic(txmsg_broker.namesrv_addr, topic)
    group = unique("plain_pg")
    inbox = Inbox()
    app = make_app()
    app.add_producer(group=group)
    app.add_message_listener(inbox, topic=topic, group=unique("plain_cg"))
    with app:
        producer = app.producer(group)
        assert not producer.transactional
        # a plain group's producer has no transactional sends (issue 37.5: no shim answers for them)
        assert not hasattr(producer, "send_in_transaction")
        with pytest.raises(InvalidMessageError, match="delay_level"):  # RocketMQ 4: no timers
            producer.send(topic, "x", deliver_at=datetime.now(UTC) + timedelta(seconds=5))

        sync = producer.send(
            topic, {"kind": "sync"}, keys=["k-1", "k-2"], tags="t1", properties={"n": 1}
        )
        assert sync.send_status == "SEND_OK"
        assert sync.message_id
        async_result = producer.send_async(topic, "async").result(10)
        assert async_result.send_status == "SEND_OK"
        producer.send_oneway(topic, "oneway")
        batch = producer.send_batch(topic, ["b0", "b1", "b2"], tags="batch")
        assert batch.send_status == "SEND_OK"
        ordered = [producer.send_orderly(topic, f"o{n}", sharding_key="order-42") for n in range(3)]
        assert len({r.queue_id for r in ordered}) == 1  # same key, same queue
        sent_delayed = time.monotonic()
        # the fixture broker scales delays by 0.001: level 15 (20 min) waits 1.2 s
        producer.send(topic, "delayed", delay_level=15)

        wanted = {b"async", b"oneway", b"b0", b"b1", b"b2", b"o0", b"o1", b"o2", b"delayed"}
        wait_until(
            lambda: wanted <= set(inbox.bodies()) and len(inbox.bodies()) >= 10,
            timeout=60,
            message=lambda: f"every send to arrive (got {inbox.bodies()})",
        )
        first = next(m for m in (inbox.message(b) for b in inbox.bodies()) if m.tags == "t1")
        assert first.json() == {"kind": "sync"}
        assert (first.keys, first.properties["n"]) == ("k-1 k-2", "1")
        assert inbox.message(b"b1").tags == "batch"
        ordered_msg = inbox.message(b"o1")
        assert ordered_msg.sharding_key == "order-42"
        assert ordered_msg.properties[SHARDING_KEY] == "order-42"
        assert ordered_msg.queue_id == ordered[1].queue_id
        assert inbox.arrival(b"delayed") - sent_delayed >= 1.1
        stats = producer.stats()
        assert (stats.plain_sent, stats.plain_failed, stats.ordered_sent) == (10, 0, 3)
        assert stats.queues == {ordered[0].queue_id: 3}


def test_a_transactional_group_also_sends_plain_messages(
    make_app: Callable[[], TxMsg], txmsg_broker: Any
) -> None:
    topic = unique("plain_tx_topic")
    create_topic(txmsg_broker.namesrv_addr, topic)
    group = unique("plain_tx_pg")
    inbox = Inbox()
    app = make_app()

    @app.transactional_listener(group=group, topics=[topic])
    class Commit:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    app.add_message_listener(inbox, topic=topic, group=unique("plain_tx_cg"))
    with app:
        producer = app.producer(group)
        assert producer.send_in_transaction(topic, "in-tx").local_state is S.COMMIT
        producer.send(topic, "plain")  # opens the group's plain-send client now
        producer.send_orderly(topic, "ordered", sharding_key="k")
        wait_until(lambda: {b"in-tx", b"plain", b"ordered"} <= set(inbox.bodies()), timeout=60)
        stats = producer.stats()
        assert (stats.sent, stats.committed, stats.plain_sent) == (1, 1, 2)


def test_an_orderly_listener_parks_a_poison_key_and_the_queue_moves_on(
    make_app: Callable[[], TxMsg], txmsg_broker: Any, tmp_path: Path
) -> None:
    """The issue's story through the app: a poison refund for one order is retried, then that
    order's messages are parked (in order, with an alert) while other orders keep flowing."""
    topic = unique("plain_ord_topic")
    create_topic(txmsg_broker.namesrv_addr, topic)
    engine = create_engine(f"sqlite:///{tmp_path / 'service.db'}")
    create_tables(engine)
    sessions = make_session_factory(engine)
    group, consumer = unique("plain_ord_pg"), unique("plain_ord_cg")
    handled: list[str] = []
    events: list[ParkedEvent] = []
    registry = ListenerRegistry()

    @registry.on_parked
    def alert(event: ParkedEvent) -> None:
        events.append(event)

    @registry.message_listener(
        topic=topic,
        group=consumer,
        orderly=True,
        session_factory=sessions,
        max_orderly_retries=2,
        orderly_retry_delay=0.1,
    )
    def settle(message: Message) -> None:
        if message.text() == "poison-1/refund":
            raise ValueError("no liability decision for poison-1")
        handled.append(message.text())

    app = make_app()
    app.add_producer(group=group)
    app.include(registry)
    with app:
        producer = app.producer(group)
        for step in ("refund", "close"):
            producer.send_orderly(topic, f"poison-1/{step}", sharding_key="poison-1")
            for n in range(4):
                producer.send_orderly(topic, f"order-{n}/{step}", sharding_key=f"order-{n}")
        wait_until(
            lambda: len(handled) >= 8 and len(events) == 1,
            timeout=60,
            message=lambda: f"other orders handled, poison parked ({handled}, {events})",
        )
        wait_until(lambda: len(parked_messages(sessions, consumer, "poison-1")) == 2, timeout=30)
    for n in range(4):
        assert [h for h in handled if h.startswith(f"order-{n}/")] == [
            f"order-{n}/refund",
            f"order-{n}/close",
        ]
    assert not [h for h in handled if h.startswith("poison-1")]
    assert (events[0].group, events[0].sharding_key, events[0].attempts) == (
        consumer,
        "poison-1",
        2,
    )
    assert "no liability decision" in events[0].error
    assert [p.message.text() for p in parked_messages(sessions, consumer, "poison-1")] == [
        "poison-1/refund",
        "poison-1/close",
    ]
    engine.dispose()
