"""The rocketmq5 consumers do not wait for their acks in a handler thread; the concurrent one also
receives ahead of its handler threads.

Why (``benchmarks.delivery_latency``, docs/guide/outbox.md "Delivery latency"): holding only
``concurrency`` messages and acking in the handler thread bounded a default listener (4 threads)
by receive and ack round trips, and it fell behind at 200 messages/s.  Now it holds up to
``HELD_PER_THREAD`` messages per thread (at least ``RECEIVE_MAX``), a handler's thread is free once
it returned, and a held message whose invisible time is nearly over is not handled (the broker
delivers it again).  The FIFO consumer still handles a group's next message only once the previous
one's ack was answered, but its thread works on other groups meanwhile.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future
from typing import Any

import pytest
from txmsg_broker.testing import create_group, create_topic, unique, wait_until
from txmsg_rocketmq5 import consumer as consumer_module
from txmsg_rocketmq5._client import ClientConfiguration, Credentials, Producer
from txmsg_rocketmq5._client import Message as ClientMessage
from txmsg_rocketmq5.consumer import LoopConsumer
from txmsg_rocketmq5.fifo import FifoConsumer
from txmsg_rocketmq5.receive import INVISIBLE_S, ReceiveLoop

from txmsg import Message


def _send(endpoint: str, topic: str, bodies: list[str]) -> None:
    producer = Producer(ClientConfiguration(endpoint, Credentials("", ""), request_timeout=10))
    producer.startup()
    try:
        for body in bodies:
            msg = ClientMessage()
            msg.topic = topic
            msg.body = body.encode()
            producer.send(msg)
    finally:
        producer.shutdown()


def _consumer(endpoint: str, topic: str, handler: Any) -> LoopConsumer:
    return LoopConsumer(
        ClientConfiguration(endpoint, Credentials("", ""), request_timeout=10),
        group=unique("cg_ahead"),
        topic=topic,
        tags="*",
        handler=handler,
        concurrency=1,
        max_reconsume=3,
    )


def test_one_thread_holds_messages_beyond_the_one_it_handles(txmsg_grpc_broker: Any) -> None:
    endpoint = txmsg_grpc_broker.grpc_endpoint
    topic = unique("rmq5_ahead")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="NORMAL")
    release = threading.Event()
    handled: list[bytes] = []

    def handle(message: Message) -> bool:
        release.wait(60)
        handled.append(message.body)
        return True

    consumer = _consumer(endpoint, topic, handle)
    try:
        assert consumer.capacity == consumer_module.RECEIVE_MAX
        _send(endpoint, topic, [f"m{i}" for i in range(3)])
        # the one handler thread is blocked in the first message; the other two are held anyway
        wait_until(lambda: consumer._busy == 3, timeout=60, message=lambda: f"{consumer._busy}")
        assert handled == []
        release.set()
        wait_until(lambda: consumer.consumed == 3, timeout=60)
        wait_until(lambda: consumer._busy == 0, timeout=60)  # every ack answered, slots free
        assert sorted(handled) == [b"m0", b"m1", b"m2"]
    finally:
        release.set()
        consumer.stop(20)


def test_a_message_held_past_its_invisible_time_is_not_handled(
    txmsg_grpc_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = txmsg_grpc_broker.grpc_endpoint
    topic = unique("rmq5_expired")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="NORMAL")
    # every held message counts as too close to its invisible time
    monkeypatch.setattr(consumer_module, "EXPIRED_MARGIN_S", INVISIBLE_S + 1)
    handled: list[bytes] = []

    def handle(message: Message) -> bool:
        handled.append(message.body)
        return True

    consumer = _consumer(endpoint, topic, handle)
    try:
        _send(endpoint, topic, ["late"])
        wait_until(lambda: consumer.expired >= 1, timeout=60)
        wait_until(lambda: consumer._busy == 0, timeout=60)
        assert handled == []
        assert consumer.consumed == 0
    finally:
        consumer.stop(20)


class HeldAcks:
    """Stands in for ``FifoConsumer._ack_async``: each ack waits until the test lets it go, then
    the real one is sent (or, for ``refuse``, the ack fails as a lost answer would)."""

    def __init__(self, refuse: int = 0) -> None:
        self.lock = threading.Lock()
        self.pending: list[tuple[FifoConsumer, Any, Future[Any]]] = []
        self.refuse = refuse

    def __call__(self, consumer: FifoConsumer, raw: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self.lock:
            self.pending.append((consumer, raw, future))
        return future

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """In place of the method of every FifoConsumer (before one starts receiving)."""

        def held(consumer: FifoConsumer, raw: Any) -> Future[Any]:
            return self(consumer, raw)

        monkeypatch.setattr(FifoConsumer, "_ack_async", held)

    def count(self) -> int:
        with self.lock:
            return len(self.pending)

    def release(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
        for consumer, raw, future in pending:
            if self.refuse:
                self.refuse -= 1
                future.set_exception(ConnectionError("the ack's answer was lost"))
            else:
                ReceiveLoop._ack_async(consumer, raw).add_done_callback(
                    functools.partial(_forward, future)
                )


def _forward(future: Future[Any], done: Future[Any]) -> None:
    exc = done.exception()
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(done.result())


def _fifo(
    endpoint: str, namesrv: str, handle: Any, messages: list[tuple[str, str]]
) -> FifoConsumer:
    """A FIFO consumer of one thread on a topic of one queue holding ``messages`` before it
    starts, so its first receive brings them all (the queue is blocked until they are acked)."""
    topic, group = unique("rmq5_fifo_ahead"), unique("cg_fifo_ahead")
    create_topic(namesrv, topic, queues=1, message_type="FIFO")
    create_group(namesrv, group, orderly=True)
    producer = Producer(ClientConfiguration(endpoint, Credentials("", ""), request_timeout=10))
    producer.startup()
    try:
        for key, body in messages:
            msg = ClientMessage()
            msg.topic = topic
            msg.body = body.encode()
            msg.message_group = key
            producer.send(msg)
    finally:
        producer.shutdown()
    return FifoConsumer(
        ClientConfiguration(endpoint, Credentials("", ""), request_timeout=10),
        group=group,
        topic=topic,
        tags="*",
        handler=handle,
        concurrency=1,
        retry_delay=1.0,
    )


class Handled:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []

    def __call__(self, message: Message) -> bool:
        with self.lock:
            self.bodies.append(message.body)
        return True

    def __repr__(self) -> str:
        with self.lock:
            return repr(self.bodies)

    def list(self) -> list[bytes]:
        with self.lock:
            return list(self.bodies)


def test_a_fifo_thread_works_on_another_group_while_an_ack_is_in_flight(
    txmsg_grpc_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    acks = HeldAcks()
    acks.install(monkeypatch)
    handled = Handled()
    consumer = _fifo(
        txmsg_grpc_broker.grpc_endpoint,
        txmsg_grpc_broker.namesrv_addr,
        handled,
        [("A", "A1"), ("A", "A2"), ("B", "B1")],
    )
    try:
        # the one thread handled A1 and, with A1's ack unanswered, B1; A2 waits for A1's ack
        wait_until(lambda: acks.count() == 2, timeout=60, message=lambda: f"{handled}")
        assert handled.list() == [b"A1", b"B1"]
        acks.release()
        wait_until(lambda: acks.count() == 1, timeout=60, message=lambda: f"{handled}")
        assert handled.list() == [b"A1", b"B1", b"A2"]
        acks.release()
        wait_until(lambda: consumer.consumed == 3, timeout=60)
    finally:
        acks.release()
        consumer.stop(20)


def test_a_fifo_ack_that_fails_hands_its_message_again_before_the_next_of_its_group(
    txmsg_grpc_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    acks = HeldAcks(refuse=1)
    acks.install(monkeypatch)
    handled = Handled()
    consumer = _fifo(
        txmsg_grpc_broker.grpc_endpoint,
        txmsg_grpc_broker.namesrv_addr,
        handled,
        [("A", "A1"), ("A", "A2")],
    )
    try:
        for expected in ([b"A1"], [b"A1", b"A1"], [b"A1", b"A1", b"A2"]):
            # the first release fails A1's ack: the group is suspended, A1 comes again first
            wait_until(lambda: acks.count() == 1, timeout=60, message=lambda: f"{handled}")
            assert handled.list() == expected
            acks.release()
        wait_until(lambda: consumer.consumed == 2, timeout=60)
        assert consumer.suspended == 1
    finally:
        acks.release()
        consumer.stop(20)
