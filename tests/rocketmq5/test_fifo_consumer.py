"""Issue 17, rocketmq5 backend: ``subscribe(orderly=True)`` - FIFO message groups consumed strictly in
order (receive -> handle -> ack before the next of a group), groups in parallel, a handler answering
False re-handed the same message ~1 s later while other groups flow, and a group the proxy does not
consume as FIFO refused at start."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from txmsg_broker.testing import create_group, create_topic, unique, wait_until
from txmsg_rocketmq5.backend import RocketMQ5Backend

from txmsg import ListenerDefinitionError, Message
from txmsg.message import OutgoingMessage


@pytest.fixture
def backend(txmsg_grpc_broker: Any) -> Iterator[RocketMQ5Backend]:
    b = RocketMQ5Backend(SimpleNamespace(endpoints=txmsg_grpc_broker.grpc_endpoint))
    yield b
    b.close(timeout=20)


def fifo_topic(broker: Any, prefix: str, queues: int) -> tuple[str, str]:
    """A FIFO topic and an orderly consumer group for it (``mqadmin updateSubGroup -o true``): a
    RocketMQ 5 proxy consumes a group in order only when the group says so."""
    topic, group = unique(prefix), unique(prefix + "CG")
    create_topic(broker.namesrv_addr, topic, queues=queues, message_type="FIFO")
    create_group(broker.namesrv_addr, group, orderly=True)
    return topic, group


class Recorder:
    """Handler recording per-key order, overlapping handlers of one key, and parallelism."""

    def __init__(self, delay: float = 0.0, fail: set[bytes] | None = None) -> None:
        self.lock = threading.Lock()
        self.delay = delay
        self.fail = set(fail or ())
        self.calls: list[tuple[str | None, bytes, float]] = []
        self.active: dict[str, int] = {}
        self.running = 0
        self.max_running = 0
        self.overlap = False

    def __call__(self, message: Message) -> bool:
        key = message.sharding_key or ""
        with self.lock:
            self.calls.append((message.sharding_key, message.body, time.monotonic()))
            self.active[key] = self.active.get(key, 0) + 1
            self.overlap |= self.active[key] > 1
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            failing = message.body in self.fail
            if failing:
                self.fail.discard(message.body)  # fails once
        try:
            if self.delay:
                time.sleep(self.delay)
            return not failing
        finally:
            with self.lock:
                self.active[key] -= 1
                self.running -= 1

    def handled(self, key: str) -> list[bytes]:
        with self.lock:
            return [b for k, b, _ in self.calls if k == key]


def test_each_group_in_order_groups_in_parallel(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    topic, group = fifo_topic(txmsg_grpc_broker, "F5Order", queues=4)
    sender = backend.create_sender(unique("pg5_fifo"))
    keys = [f"order-{k}" for k in range(8)]
    for i in range(6):
        for key in keys:
            sender.send(OutgoingMessage(topic, f"{key}:{i}".encode(), sharding_key=key))
    rec = Recorder(delay=0.02)
    backend.subscribe(topic, group, rec, concurrency=4, orderly=True)
    wait_until(lambda: len(rec.calls) >= 48, timeout=60, message="48 deliveries")
    for key in keys:
        assert rec.handled(key) == [f"{key}:{i}".encode() for i in range(6)]
    assert not rec.overlap  # never two messages of one group at once
    assert rec.max_running > 1  # groups did run in parallel


def test_false_rehands_the_same_message_and_holds_only_its_group(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    topic, group = fifo_topic(
        txmsg_grpc_broker, "F5Suspend", queues=1
    )  # one queue: both groups share it
    sender = backend.create_sender(unique("pg5_susp"))
    for i in range(4):
        for key in ("A", "B"):
            sender.send(OutgoingMessage(topic, f"{key}{i}".encode(), sharding_key=key))
    rec = Recorder(fail={b"A1"})
    backend.subscribe(topic, group, rec, concurrency=2, orderly=True)
    wait_until(
        lambda: len(rec.handled("A")) >= 5 and len(rec.handled("B")) >= 4,
        timeout=60,
        message="A (with one retry) and B handled",
    )
    assert rec.handled("A") == [b"A0", b"A1", b"A1", b"A2", b"A3"]  # A1 again, A2 only after it
    assert rec.handled("B") == [b"B0", b"B1", b"B2", b"B3"]
    times = {(k, b): t for k, b, t in rec.calls}
    first_fail = next(t for k, b, t in rec.calls if b == b"A1")
    retried = [t for k, b, t in rec.calls if b == b"A1"][1]
    assert retried - first_fail >= 0.9  # suspended about ORDERLY_RETRY_DELAY (1 s), never at once
    assert times[("B", b"B0")] < retried  # B was not held behind A's retry
    time.sleep(0.5)
    assert len(rec.calls) == 9  # nothing handled twice besides the refused A1


def test_sharding_key_and_message_without_group(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    topic, group = fifo_topic(txmsg_grpc_broker, "F5Key", queues=2)
    sender = backend.create_sender(unique("pg5_key"))
    sender.send(OutgoingMessage(topic, b"keyed", sharding_key="tenant-1:order-9"))
    rec = Recorder()
    backend.subscribe(topic, group, rec, concurrency=1, orderly=True)
    wait_until(lambda: len(rec.calls) >= 1, timeout=30, message="the delivery")
    assert rec.calls[0][:2] == ("tenant-1:order-9", b"keyed")


def test_orderly_on_a_group_the_proxy_does_not_consume_in_order_is_refused(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    topic, group = unique("F5NotFifo"), unique("F5NotFifoCG")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="NORMAL")
    with pytest.raises(ListenerDefinitionError, match="updateSubGroup"):
        backend.subscribe(topic, group, Recorder(), orderly=True)
    # the group is free again: a plain listener may take it
    backend.subscribe(topic, group, Recorder())


def test_fifo_topic_but_group_not_created_orderly_is_refused(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    topic, group = unique("F5NoSubGroup"), unique("F5NoSubGroupCG")
    create_topic(
        txmsg_grpc_broker.namesrv_addr, topic, message_type="FIFO"
    )  # no create_group(orderly=True)
    with pytest.raises(ListenerDefinitionError, match=f"updateSubGroup -g {group} -o true"):
        backend.subscribe(topic, group, Recorder(), orderly=True)
