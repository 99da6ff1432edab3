"""Issue 17, rocketmq5 backend: plain sends (``RocketMQ5Backend.create_sender``) through the official
5.x client to the embedded broker's gRPC endpoint - what this backend does its own way: batch (one by
one), ordered (FIFO message group), delayed (delivery timestamps from delay levels and from
``deliver_at``), and the errors a caller can act on.  Deliveries are read back with the backend's own
consumer.  Sync, async and one-way sends arriving is the contract's (tests/contract)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from txmsg_broker.testing import create_topic, unique, wait_until
from txmsg_rocketmq5.backend import RocketMQ5Backend

from txmsg import InvalidMessageError, Message, ProducerClosedError
from txmsg.backend import MessageSender, capabilities_of
from txmsg.message import SHARDING_KEY, OutgoingMessage


class Seen:
    """What a consumer received, with the time each arrived."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[float, Message]] = []

    def __call__(self, message: Message) -> bool:
        with self.lock:
            self.items.append((time.monotonic(), message))
        return True

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for _, m in self.items]

    def messages(self) -> list[Message]:
        with self.lock:
            return [m for _, m in self.items]


@pytest.fixture
def backend(txmsg_grpc_broker: Any) -> Iterator[RocketMQ5Backend]:
    b = RocketMQ5Backend(SimpleNamespace(endpoints=txmsg_grpc_broker.grpc_endpoint))
    yield b
    b.close(timeout=20)


def consume(backend: RocketMQ5Backend, topic: str) -> Seen:
    seen = Seen()
    backend.subscribe(topic, unique("cg5_plain"), seen, concurrency=2)
    return seen


def test_capabilities_say_what_rocketmq5_emulates() -> None:
    caps = capabilities_of(RocketMQ5Backend)
    assert (
        caps.oneway,
        caps.batch,
        caps.delay_levels,
        caps.delivery_timestamps,
        caps.orderly_consumer,
    ) == (
        False,
        False,
        True,
        True,
        True,
    )


def test_a_send_reports_its_queue_and_offset(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    """The 5.x answer names the queue of every send (librocketmq's C API reports it for ordered
    sends only).  That sends of every kind arrive with their tags, keys and properties is the
    contract's (tests/contract/test_sends_contract.py)."""
    topic = unique("P5Plain")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="NORMAL")
    sender = backend.create_sender(unique("pg5_plain"))
    assert isinstance(sender, MessageSender)
    result = sender.send(
        OutgoingMessage(topic, b"sync", tags="T", keys="k1 k2", properties={"p": "v"})
    )
    assert result.send_status == "SEND_OK"
    assert result.message_id
    assert result.queue_id is not None
    assert result.offset is not None


def test_batch_is_sent_one_by_one_in_order(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    topic = unique("P5Batch")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, queues=1, message_type="NORMAL")
    sender = backend.create_sender(unique("pg5_batch"))
    result = sender.send_batch([OutgoingMessage(topic, f"b{i}".encode()) for i in range(6)])
    assert len(result.message_ids) == 6
    seen = consume(backend, topic)
    wait_until(lambda: len(seen.bodies()) >= 6, timeout=30, message="6 deliveries")
    got = seen.messages()
    assert sorted(m.message_id or "" for m in got) == sorted(result.message_ids)
    # one queue: the store order is the send order
    by_id = {m.message_id: m.body for m in got}
    assert [by_id[i] for i in result.message_ids] == [f"b{i}".encode() for i in range(6)]
    with pytest.raises(InvalidMessageError, match="one topic"):
        sender.send_batch([OutgoingMessage(topic, b"x"), OutgoingMessage(topic + "x", b"y")])
    with pytest.raises(InvalidMessageError, match="at least one"):
        sender.send_batch([])


def test_sharding_key_is_the_message_group_same_key_same_queue(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    topic = unique("P5Fifo")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, queues=4, message_type="FIFO")
    sender = backend.create_sender(unique("pg5_fifo"))
    queues: dict[str, set[int | None]] = {}
    for i in range(5):
        for key in ("order-1", "order-2", "order-3"):
            r = sender.send(
                OutgoingMessage(
                    topic,
                    f"{key}:{i}".encode(),
                    sharding_key=key,
                    properties={SHARDING_KEY: "ignored"},
                )
            )
            queues.setdefault(key, set()).add(r.queue_id)
    assert all(len(q) == 1 and None not in q for q in queues.values())
    seen = consume(backend, topic)
    wait_until(lambda: len(seen.bodies()) >= 15, timeout=30, message="15 deliveries")
    for m in seen.messages():
        assert m.sharding_key == m.body.decode().split(":")[0]
        assert m.properties.get(SHARDING_KEY, m.sharding_key) == m.sharding_key


def test_ordered_send_to_a_normal_topic_is_refused_naming_the_fix(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    topic = unique("P5NotFifo")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="NORMAL")
    sender = backend.create_sender(unique("pg5_nf"))
    with pytest.raises(InvalidMessageError, match="--type FIFO"):
        sender.send(OutgoingMessage(topic, b"x", sharding_key="k"))
    failed = sender.send_async(OutgoingMessage(topic, b"x", sharding_key="k"))
    assert isinstance(failed.exception(timeout=20), InvalidMessageError)
    with pytest.raises(InvalidMessageError, match="blank"):
        sender.send(OutgoingMessage(topic, b"x", sharding_key=" "))
    with pytest.raises(InvalidMessageError, match="empty"):
        sender.send(OutgoingMessage(topic, b""))


def test_delay_level_and_deliver_at_become_delivery_timestamps(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    topic = unique("P5Delay")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="DELAY")
    sender = backend.create_sender(unique("pg5_delay"))
    seen = consume(backend, topic)
    sent_at = time.monotonic()
    sender.send(OutgoingMessage(topic, b"level-1", delay_level=1))  # DELAY_LEVELS[0] = 1 s
    sender.send(OutgoingMessage(topic, b"at", deliver_at_ms=int(time.time() * 1000) + 1000))
    wait_until(lambda: len(seen.bodies()) >= 2, timeout=30, message="2 delayed deliveries")
    for arrived, _ in seen.items:
        assert arrived - sent_at >= 1.0  # a bound, not a timing: never delivered before it is due
    for bad in (0, 19):
        with pytest.raises(InvalidMessageError, match=r"delay_level must be 1\.\.18"):
            sender.send(OutgoingMessage(topic, b"x", delay_level=bad))
    with pytest.raises(InvalidMessageError, match="not both"):
        sender.send(OutgoingMessage(topic, b"x", delay_level=1, deliver_at_ms=1))


def test_close_waits_for_async_sends_then_refuses_new_ones(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any
) -> None:
    topic = unique("P5Close")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="NORMAL")
    sender = backend.create_sender(unique("pg5_close"))
    futures = [sender.send_async(OutgoingMessage(topic, f"m{i}".encode())) for i in range(20)]
    sender.close(timeout=20)
    assert all(f.done() and f.exception() is None for f in futures)
    with pytest.raises(ProducerClosedError):
        sender.send(OutgoingMessage(topic, b"late"))
    with pytest.raises(ProducerClosedError):
        sender.send_async(OutgoingMessage(topic, b"late"))
