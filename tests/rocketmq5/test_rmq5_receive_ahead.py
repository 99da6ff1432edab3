"""The rocketmq5 concurrent consumer receives ahead of its handler threads and acks asynchronously.

Why (``benchmarks.delivery_latency``, docs/guide/outbox.md "Delivery latency"): holding only
``concurrency`` messages and acking in the handler thread bounded a default listener (4 threads)
by receive and ack round trips, and it fell behind at 200 messages/s.  Now it holds up to
``HELD_PER_THREAD`` messages per thread (at least ``RECEIVE_MAX``), a handler's thread is free once
it returned, and a held message whose invisible time is nearly over is not handled (the broker
delivers it again).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from txmsg_broker.testing import create_topic, unique, wait_until
from txmsg_rocketmq5 import consumer as consumer_module
from txmsg_rocketmq5._client import ClientConfiguration, Credentials, Producer
from txmsg_rocketmq5._client import Message as ClientMessage
from txmsg_rocketmq5.consumer import LoopConsumer
from txmsg_rocketmq5.receive import INVISIBLE_S

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
