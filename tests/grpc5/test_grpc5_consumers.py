"""Issue 13 (consumer half): SimpleConsumer and PushConsumer of the official RocketMQ 5 Python client
against the embedded broker's gRPC endpoint - receive / ack / change invisible duration, redelivery with
delivery attempts, retry then DLQ, FIFO order per message group, delivery timestamps, forged and expired
receipt handles, and messages crossing between gRPC and remoting over the one store.

Only ``rocketmq-python-client`` talks to the gRPC endpoint here (remoting sides use librocketmq through
``txmsg_broker.testing.Clients``, as in the other broker tests). Waits are on events
(``wait_until``), never on the clock; the fixture's ``delay_scale=0.001`` makes the retry back-off and the
minimum invisible time of a receive milliseconds, exactly as it does for RocketMQ's delay levels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import Code
from rocketmq.v5.exception import BadRequestException, InternalErrorException

from txmsg_broker.testing import Clients, create_topic, unique, wait_until

AWAIT_S = 5  # the proxy's minimum long polling time: a receive that finds nothing answers after it


def config(broker: Any) -> ClientConfiguration:
    return ClientConfiguration(broker.grpc_endpoint, Credentials(), request_timeout=10)


@contextmanager
def producer(broker: Any, topic: str) -> Iterator[Producer]:
    p = Producer(config(broker), (topic,))
    p.startup()
    try:
        yield p
    finally:
        p.shutdown()


@contextmanager
def simple_consumer(broker: Any, group: str, topic: str, tag: str = "*") -> Iterator[SimpleConsumer]:
    c = SimpleConsumer(config(broker), group, {topic: FilterExpression(tag)}, await_duration=AWAIT_S)
    c.startup()
    try:
        yield c
    finally:
        c.shutdown()


def message(topic: str, body: bytes, *, keys: str = "", tag: str = "T", group: str = "", deliver_at_ms: int = 0) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    m.tag = tag
    if keys:
        m.keys = keys
    if group:
        m.message_group = group
    if deliver_at_ms:
        m.delivery_timestamp = deliver_at_ms
    return m


def receive_until(consumer: SimpleConsumer, want: int, invisible_s: int = 30, timeout: float = 60) -> list[Message]:
    """Receive until ``want`` messages arrived (each receive may legitimately return none)."""
    got: list[Message] = []

    def more() -> bool:
        got.extend(consumer.receive(32, invisible_s))
        return len(got) >= want

    wait_until(more, timeout=timeout, interval=0, message=lambda: f"{want} messages, got {len(got)}")
    return got


def test_simple_consumer_receive_ack_redelivery_and_change_invisible(txmsg_grpc_broker):
    broker = txmsg_grpc_broker
    topic, group = unique("G5Simple"), unique("G5SimpleCG")
    create_topic(broker.namesrv_addr, topic, queues=2, message_type="NORMAL")
    with producer(broker, topic) as p, simple_consumer(broker, group, topic) as c:
        sent = {p.send(message(topic, f"m{i}".encode(), keys=f"k{i}")).message_id for i in range(3)}
        first = receive_until(c, 3, invisible_s=30)
        assert {m.message_id for m in first} == sent
        assert all(m.delivery_attempt == 1 and m.receipt_handle for m in first)
        assert sorted(m.body for m in first) == [b"m0", b"m1", b"m2"]
        acked, nacked, extended = first
        c.ack(acked)
        c.change_invisible_duration(nacked, 1)  # visible again in 1 s: redelivered, attempt 2
        again = receive_until(c, 1)
        assert [(m.message_id, m.delivery_attempt) for m in again] == [(nacked.message_id, 2)]
        c.ack(again[0])
        # the one still invisible (30 s) is not delivered meanwhile; acking it ends it
        c.change_invisible_duration(extended, 60)
        c.ack(extended)  # change_invisible_duration put the new handle on the message
        p.send(message(topic, b"last"))
        tail = receive_until(c, 1)
        assert [m.body for m in tail] == [b"last"]
        c.ack(tail[0])


def test_redelivery_after_the_invisible_time_counts_attempts(txmsg_grpc_broker):
    broker = txmsg_grpc_broker
    topic, group = unique("G5Redeliver"), unique("G5RedeliverCG")
    create_topic(broker.namesrv_addr, topic, queues=1, message_type="NORMAL")
    with producer(broker, topic) as p, simple_consumer(broker, group, topic) as c:
        msg_id = p.send(message(topic, b"again")).message_id
        attempts = []
        for _ in range(3):  # never acked: each time the (1 s) invisible time runs out it comes back
            (m,) = receive_until(c, 1, invisible_s=1)
            assert m.message_id == msg_id
            attempts.append(m.delivery_attempt)
        assert attempts == [1, 2, 3]
        c.ack(m)
