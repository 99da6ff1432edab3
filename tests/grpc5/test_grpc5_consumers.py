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
from txmsg_broker.testing import Clients, create_group, create_topic, read_log, unique, wait_until

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
def simple_consumer(
    broker: Any, group: str, topic: str, tag: str = "*"
) -> Iterator[SimpleConsumer]:
    c = SimpleConsumer(
        config(broker), group, {topic: FilterExpression(tag)}, await_duration=AWAIT_S
    )
    c.startup()
    try:
        yield c
    finally:
        c.shutdown()


def message(
    topic: str,
    body: bytes,
    *,
    keys: str = "",
    tag: str = "T",
    group: str = "",
    deliver_at_s: int = 0,
) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    m.tag = tag
    if keys:
        m.keys = keys
    if group:
        m.message_group = group
    if deliver_at_s:
        m.delivery_timestamp = deliver_at_s
    return m


def receive_until(
    consumer: SimpleConsumer, want: int, invisible_s: int = 30, timeout: float = 60, batch: int = 32
) -> list[Message]:
    """Receive until ``want`` messages arrived (each receive may legitimately return none)."""
    got: list[Message] = []

    def more() -> bool:
        got.extend(consumer.receive(batch, invisible_s))
        return len(got) >= want

    wait_until(
        more, timeout=timeout, interval=0, message=lambda: f"{want} messages, got {len(got)}"
    )
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


def test_forged_and_expired_receipt_handles_get_the_proxy_codes(txmsg_grpc_broker):
    broker = txmsg_grpc_broker
    topic, group = unique("G5Handle"), unique("G5HandleCG")
    create_topic(broker.namesrv_addr, topic, queues=1, message_type="NORMAL")
    with producer(broker, topic) as p, simple_consumer(broker, group, topic) as c:
        msg_id = p.send(message(topic, b"h")).message_id
        (m,) = receive_until(c, 1, invisible_s=1)
        real = m.receipt_handle
        # not a handle at all: ReceiptHandle.decode fails, the proxy answers INTERNAL_SERVER_ERROR
        m.receipt_handle = "forged"
        with pytest.raises(InternalErrorException) as error:
            c.ack(m)
        assert (
            error.value.code == Code.INTERNAL_SERVER_ERROR
        )  # the entry's detail stays in the entry
        with pytest.raises(InternalErrorException) as error:
            c.change_invisible_duration(m, 5)
        assert "Parse failed, dataList size 1" in str(error.value)
        # well formed, but of a broker that does not exist
        parts = real.split(" ")
        parts[5] = "no-such-broker"
        m.receipt_handle = " ".join(parts)
        with pytest.raises(BadRequestException) as error:
            c.ack(m)
        assert error.value.code == Code.INVALID_RECEIPT_HANDLE
        with pytest.raises(BadRequestException) as error:
            c.change_invisible_duration(m, 5)
        assert "cannot find broker no-such-broker" in str(error.value)
        # the forged acks acked nothing: the message comes back once its second runs out
        (again,) = receive_until(c, 1, invisible_s=30)
        assert (again.message_id, again.delivery_attempt) == (msg_id, 2)
        # the first delivery's handle has expired by now (that is why it was delivered again)
        m.receipt_handle = real
        with pytest.raises(BadRequestException) as error:
            c.ack(m)
        assert error.value.code == Code.INVALID_RECEIPT_HANDLE
        with pytest.raises(BadRequestException) as error:
            c.change_invisible_duration(m, 5)
        assert error.value.code == Code.INVALID_RECEIPT_HANDLE
        assert "receipt handle is expired" in str(error.value)
        c.ack(again)  # the live handle still works


def receive_or_none(consumer: SimpleConsumer) -> list[Message] | None:
    """One receive; None while the topic has no route yet (the client raises a bare Exception)."""
    try:
        return consumer.receive(32, 30) or None
    except Exception:  # noqa: BLE001
        return None


class Recorder(MessageListener):
    """A MessageListener that records deliveries and answers with ``result(message)``."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[tuple[str, str, bytes, int]] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.seen.append(
                (
                    message.message_id,
                    message.message_group or "",
                    message.body,
                    message.delivery_attempt,
                )
            )
        return ConsumeResult.FAILURE if self.fail else ConsumeResult.SUCCESS

    def snapshot(self) -> list[tuple[str, str, bytes, int]]:
        with self.lock:
            return list(self.seen)


@contextmanager
def push_consumer(
    broker: Any, group: str, topic: str, listener: MessageListener
) -> Iterator[PushConsumer]:
    c = PushConsumer(config(broker), group, listener, {topic: FilterExpression()})
    c.startup()
    try:
        yield c
    finally:
        c.shutdown()


def test_push_consumer_with_a_message_listener(txmsg_grpc_broker):
    broker = txmsg_grpc_broker
    topic, group = unique("G5Push"), unique("G5PushCG")
    create_topic(broker.namesrv_addr, topic, queues=4, message_type="NORMAL")
    listener = Recorder()
    with producer(broker, topic) as p, push_consumer(broker, group, topic, listener):
        sent = {p.send(message(topic, f"p{i}".encode())).message_id for i in range(10)}
        wait_until(
            lambda: {s[0] for s in listener.snapshot()} >= sent, timeout=60, message="10 deliveries"
        )
    assert sorted(s[0] for s in listener.snapshot()) == sorted(sent)  # once each: all acked
    assert {s[3] for s in listener.snapshot()} == {1}


def test_retry_then_dead_letter_queue(txmsg_grpc_broker):
    broker = txmsg_grpc_broker
    topic, group = unique("G5Retry"), unique("G5RetryCG")
    create_topic(broker.namesrv_addr, topic, queues=1, message_type="NORMAL")
    listener = Recorder(fail=True)
    with producer(broker, topic) as p, push_consumer(broker, group, topic, listener) as c:
        msg_id = p.send(message(topic, b"poison", keys="poison")).message_id
        # 16 retries: 17 delivery attempts (the max attempts the client got in Settings), then the DLQ
        max_attempts = 17
        wait_until(
            lambda: len(listener.snapshot()) >= max_attempts, timeout=120, message="17 attempts"
        )
        dlq = f"%DLQ%{group}"
        # the 18th pop moves it (PopMessageResultFilter TO_DLQ) and creates the DLQ topic: wait for its route
        d = SimpleConsumer(
            config(broker), unique("G5DlqCG"), {dlq: FilterExpression()}, await_duration=AWAIT_S
        )
        d.startup()
        try:
            (dead,) = wait_until(
                lambda: receive_or_none(d),
                timeout=60,
                interval=0.2,
                message=lambda: (
                    f"the DLQ message; {listener.snapshot()[-3:]}; broker.log: "
                    + " || ".join(read_log(broker.log_dir, "broker.log").splitlines()[-8:])
                ),
            )
            assert (dead.message_id, dead.body, dead.topic) == (msg_id, b"poison", dlq)
            assert (
                dead.delivery_attempt == max_attempts + 1
            )  # reconsumeTimes 17 as stored in the DLQ
            d.ack(dead)
        finally:
            d.shutdown()
        assert c.consumer_group == group
    attempts = [s[3] for s in listener.snapshot() if s[0] == msg_id]
    assert attempts == list(range(1, max_attempts + 1))  # never an 18th delivery


def test_fifo_order_per_message_group_next_only_after_ack(txmsg_grpc_broker):
    broker = txmsg_grpc_broker
    topic, group = unique("G5Fifo"), unique("G5FifoCG")
    create_topic(broker.namesrv_addr, topic, queues=1, message_type="FIFO")
    create_group(
        broker.namesrv_addr, group, orderly=True
    )  # the proxy pops in order only for such a group
    with producer(broker, topic) as p, simple_consumer(broker, group, topic) as c:
        order = [("A", 1), ("B", 1), ("A", 2), ("B", 2), ("A", 3)]
        for g, i in order:
            p.send(message(topic, f"{g}{i}".encode(), group=g))
        got: list[bytes] = []
        (first,) = receive_until(c, 1, batch=1)
        assert first.body == b"A1"
        assert first.message_group == "A"
        assert c.receive(1, 30) == []  # the queue is blocked until A1 is acked
        c.ack(first)
        got.append(first.body)
        while len(got) < len(order):
            (m,) = receive_until(c, 1, batch=1)
            got.append(m.body)
            c.ack(m)
        assert got == [f"{g}{i}".encode() for g, i in order]


def test_fifo_push_consumer_keeps_each_group_in_order(txmsg_grpc_broker):
    broker = txmsg_grpc_broker
    topic, group = unique("G5FifoPush"), unique("G5FifoPushCG")
    create_topic(broker.namesrv_addr, topic, queues=2, message_type="FIFO")
    create_group(broker.namesrv_addr, group, orderly=True)
    listener = Recorder()
    with producer(broker, topic) as p, push_consumer(broker, group, topic, listener) as c:
        for i in range(6):
            for g in ("X", "Y", "Z"):
                p.send(message(topic, f"{g}{i}".encode(), group=g))
        wait_until(lambda: len(listener.snapshot()) >= 18, timeout=60, message="18 deliveries")
        assert c.fifo  # the Settings answer said so: the group is orderly
    for g in ("X", "Y", "Z"):
        assert [s[2] for s in listener.snapshot() if s[1] == g] == [
            f"{g}{i}".encode() for i in range(6)
        ]


def test_fifo_topic_with_a_group_not_created_orderly_is_popped_concurrently(txmsg_grpc_broker):
    """As a real proxy (``mergeSubscriptionData``: fifo = the group's consumeMessageOrderly): the topic
    type does not make a group FIFO, so a missing ``updateSubGroup -o true`` shows here, not in production."""
    broker = txmsg_grpc_broker
    topic, group = unique("G5FifoNotOrderly"), unique("G5FifoNotOrderlyCG")
    create_topic(broker.namesrv_addr, topic, queues=1, message_type="FIFO")
    with producer(broker, topic) as p, simple_consumer(broker, group, topic) as c:
        for i in range(2):
            p.send(message(topic, f"A{i}".encode(), group="A"))
        (first,) = receive_until(c, 1, batch=1)
        (second,) = receive_until(c, 1, batch=1)  # not blocked behind the unacked first one
        assert [first.body, second.body] == [b"A0", b"A1"]


def test_delivery_timestamp_not_visible_before(txmsg_grpc_broker):
    broker = txmsg_grpc_broker
    topic, group = unique("G5Delay"), unique("G5DelayCG")
    create_topic(broker.namesrv_addr, topic, queues=1, message_type="DELAY")
    with producer(broker, topic) as p, simple_consumer(broker, group, topic) as c:
        deliver_at_s = int(time.time()) + 3  # the 5.x client takes epoch seconds here
        msg_id = p.send(message(topic, b"later", deliver_at_s=deliver_at_s)).message_id
        (m,) = receive_until(c, 1)
        assert time.time() >= deliver_at_s  # a bound, not a timing: never visible before
        assert (m.message_id, m.delivery_timestamp) == (msg_id, deliver_at_s * 1000)
        c.ack(m)


def test_remoting_and_grpc_share_the_store_and_keep_their_own_progress(txmsg_grpc_broker):
    broker = txmsg_grpc_broker
    topic = unique("G5Cross")
    create_topic(broker.namesrv_addr, topic, queues=2, message_type="NORMAL")
    from rocketmq.client import Message as RemotingMessage  # noqa: PLC0415 - loads librocketmq: only this test needs the remoting client

    with Clients(broker.namesrv_addr) as clients:
        remoting_seen = clients.consumer(unique("G5CrossRemotingCG"), topic)
        sender = clients.producer(unique("G5CrossPG"))
        with (
            producer(broker, topic) as p,
            simple_consumer(broker, unique("G5CrossGrpcCG"), topic) as c,
        ):
            grpc_id = p.send(message(topic, b"from-grpc", keys="from-grpc")).message_id
            legacy = RemotingMessage(topic)
            legacy.set_keys("from-remoting")
            legacy.set_tags("T")
            legacy.set_body(b"from-remoting")
            sender.send_sync(legacy)
            got = receive_until(c, 2)
            assert sorted(m.body for m in got) == [b"from-grpc", b"from-remoting"]
            for m in got:
                c.ack(m)
            # the remoting group gets both too: gRPC progress did not move its offsets
            wait_until(
                lambda: {r.keys for r in remoting_seen} >= {"from-grpc", "from-remoting"},
                timeout=60,
                message="both messages at the remoting consumer",
            )
            assert {r.msg_id for r in remoting_seen if r.keys == "from-grpc"} == {grpc_id}
