"""Plain sends of the rocketmq backend (``RocketMQBackend.create_sender``) with the real
librocketmq 2.1.0 against the embedded broker: sync, async, one-way, batch, ordered, delayed,
what is refused before sending, and closing with sends still pending."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
from rmq_helpers import create_topic, unique, wait_until
from txmsg_rocketmq import sender as sender_module
from txmsg_rocketmq.backend import RocketMQBackend
from txmsg_rocketmq.sender import java_string_hash, queue_index

from txmsg.backend import MessageSender
from txmsg.errors import InvalidMessageError, ProducerClosedError, SendError
from txmsg.message import Message, OutgoingMessage, SendResult

QUEUES = 4  # the topic CLI's default


class Inbox:
    """What a consumer received, with arrival times."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[tuple[float, Message]] = []

    def __call__(self, message: Message) -> bool:
        with self.lock:
            self.messages.append((time.monotonic(), message))
        return True

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for _, m in self.messages]

    def by_body(self) -> dict[bytes, Message]:
        with self.lock:
            return {m.body: m for _, m in self.messages}

    def arrival(self, body: bytes) -> float:
        with self.lock:
            return next(t for t, m in self.messages if m.body == body)


def _topic(txmsg_broker: Any, prefix: str) -> str:
    topic = unique(prefix)
    create_topic(txmsg_broker.namesrv_addr, topic)
    return topic


def _backend(broker: Any, tmp_path: Any) -> RocketMQBackend:
    class Config:
        name_server = broker.namesrv_addr
        client_log_dir = str(tmp_path / "client-logs")
        instance_prefix = "t"

    return RocketMQBackend(Config())


def _consume(backend: RocketMQBackend, topic: str) -> Inbox:
    inbox = Inbox()
    backend.subscribe(topic, unique("pl_cg"), inbox, concurrency=4)
    return inbox


# ---- pure functions ------------------------------------------------------------------------
def test_the_queue_of_a_key_is_javas_select_message_queue_by_hash() -> None:
    """Java's String.hashCode (known values), then hashCode % n made non-negative, so Java and
    Python producers put one key on the same queue."""
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)  # Math.abs would stay negative
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # two UTF-16 code units
    assert queue_index("polygenelubricants", 3) == 2  # 2**31 % 3, never negative
    assert queue_index("hello", 4) == 99162322 % 4


# ---- sends -----------------------------------------------------------------------------------
def test_a_sync_send_arrives_with_keys_tags_properties_and_its_queue(
    backend: RocketMQBackend, txmsg_broker: Any
) -> None:
    topic = _topic(txmsg_broker, "pl_sync")
    sender = backend.create_sender(unique("pl_pg"))
    assert isinstance(sender, MessageSender)
    inbox = _consume(backend, topic)
    result = sender.send(
        OutgoingMessage(
            topic=topic, body=b"one", keys="order-1", tags="paid", properties={"p": "v"}
        )
    )
    assert result.send_status == "SEND_OK"
    assert result.message_id
    assert result.offset is not None
    assert result.queue_id is None  # the C API does not report the queue of an unordered send
    wait_until(lambda: b"one" in inbox.bodies(), timeout=30)
    got = inbox.by_body()[b"one"]
    assert (got.keys, got.tags, got.properties["p"]) == ("order-1", "paid", "v")
    assert got.message_id == result.message_id
    assert got.sharding_key is None
    assert got.queue_id is not None
    assert 0 <= got.queue_id < QUEUES
    assert got.queue_offset == result.offset


def test_same_key_same_queue_in_order_with_the_key_in_its_property(
    backend: RocketMQBackend, txmsg_broker: Any
) -> None:
    topic = _topic(txmsg_broker, "pl_ord")
    sender = backend.create_sender(unique("pl_pg"))
    inbox = _consume(backend, topic)
    keys = [f"order-{i}" for i in range(8)]
    results: dict[str, list[SendResult]] = {k: [] for k in keys}
    for n in range(5):
        for key in keys:
            results[key].append(
                sender.send(
                    OutgoingMessage(topic=topic, body=f"{key}/{n}".encode(), sharding_key=key)
                )
            )
    used = set()
    for key, sent in results.items():
        assert {r.queue_id for r in sent} == {queue_index(key, QUEUES)}
        offsets = [r.offset or 0 for r in sent]
        assert offsets == sorted(offsets)
        used.add(sent[0].queue_id)
    assert len(used) > 1  # eight keys are not all hashed to one queue
    wait_until(lambda: len(inbox.bodies()) == 40, timeout=30)
    for message in inbox.by_body().values():
        key = message.body.decode().split("/")[0]
        assert message.sharding_key == key
        assert message.properties["__SHARDINGKEY"] == key
        assert message.queue_id == queue_index(key, QUEUES)


def test_async_sends_complete_their_futures(backend: RocketMQBackend, txmsg_broker: Any) -> None:
    topic = _topic(txmsg_broker, "pl_async")
    sender = backend.create_sender(unique("pl_pg"))
    inbox = _consume(backend, topic)
    plain = [
        sender.send_async(OutgoingMessage(topic=topic, body=f"a{i}".encode())) for i in range(20)
    ]
    ordered = [
        sender.send_async(
            OutgoingMessage(topic=topic, body=f"o{i}".encode(), sharding_key="cart-7")
        )
        for i in range(5)
    ]
    assert all(isinstance(f, Future) for f in plain + ordered)
    results = [f.result(timeout=20) for f in plain + ordered]
    assert {r.send_status for r in results} == {"SEND_OK"}
    assert len({r.message_id for r in results}) == 25
    assert {r.queue_id for r in results[20:]} == {queue_index("cart-7", QUEUES)}
    assert not plain[0].cancel()  # a send on the wire cannot be cancelled
    wait_until(lambda: len(inbox.bodies()) == 25, timeout=30)
    ids = {m.message_id for m in inbox.by_body().values()}
    assert ids == {r.message_id for r in results}
    assert sender.stats()["pending"] == 0


def test_a_refused_send_raises_send_error_sync_and_async(
    txmsg_broker_factory: Any, tmp_path: Any
) -> None:
    broker = txmsg_broker_factory(auto_create_topics=False)
    be = _backend(broker, tmp_path)
    sender = be.create_sender(unique("pl_pg"))
    missing = unique("pl_missing")  # never created, and this broker does not auto-create topics
    with pytest.raises(SendError, match="topic exists"):
        sender.send(OutgoingMessage(topic=missing, body=b"x"))
    with pytest.raises(SendError, match="not re-routed"):
        sender.send(OutgoingMessage(topic=missing, body=b"x", sharding_key="k"))
    future = sender.send_async(OutgoingMessage(topic=missing, body=b"x"))
    with pytest.raises(SendError):
        future.result(timeout=20)
    assert sender.stats()["failed"] == 3
    be.close(timeout=20)


def test_oneway_sends_arrive(backend: RocketMQBackend, txmsg_broker: Any) -> None:
    topic = _topic(txmsg_broker, "pl_oneway")
    sender = backend.create_sender(unique("pl_pg"))
    inbox = _consume(backend, topic)
    for i in range(5):
        sender.send_oneway(OutgoingMessage(topic=topic, body=f"w{i}".encode()))
    sender.send_oneway(OutgoingMessage(topic=topic, body=b"keyed", sharding_key="k9"))
    wait_until(lambda: len(inbox.bodies()) == 6, timeout=30)
    assert inbox.by_body()[b"keyed"].queue_id == queue_index("k9", QUEUES)


def test_a_batch_is_sent_one_by_one_in_order(backend: RocketMQBackend, txmsg_broker: Any) -> None:
    """Not librocketmq's SendBatchMessage (a real broker stores it as one message: see
    ``send_batch``): every message its own send, in order, every id answered."""
    topic = _topic(txmsg_broker, "pl_batch")
    sender = backend.create_sender(unique("pl_pg"))
    inbox = _consume(backend, topic)
    batch = [
        OutgoingMessage(topic=topic, body=f"b{i}".encode(), keys=f"k{i}", properties={"i": str(i)})
        for i in range(10)
    ]
    result = sender.send_batch(batch)
    assert result.send_status == "SEND_OK"
    assert len(result.message_ids) == 10
    wait_until(lambda: len(inbox.bodies()) == 10, timeout=30)
    got = inbox.by_body()
    assert [got[f"b{i}".encode()].message_id for i in range(10)] == list(result.message_ids)
    assert [got[f"b{i}".encode()].properties["i"] for i in range(10)] == [str(i) for i in range(10)]
    assert sender.stats()["sent"] == 10


def test_a_delay_level_arrives_late(backend: RocketMQBackend, txmsg_broker: Any) -> None:
    """The fixture broker scales delays by 0.001: level 15 (20 min) waits 1.2 s."""
    topic = _topic(txmsg_broker, "pl_delay")
    sender = backend.create_sender(unique("pl_pg"))
    inbox = _consume(backend, topic)
    sent_at = time.monotonic()
    sender.send(OutgoingMessage(topic=topic, body=b"later", delay_level=15))
    sender.send(OutgoingMessage(topic=topic, body=b"now"))
    wait_until(lambda: {b"now", b"later"} <= set(inbox.bodies()), timeout=30)
    assert inbox.bodies()[0] == b"now"
    assert inbox.arrival(b"later") - sent_at >= 1.1
    assert inbox.by_body()[b"later"].topic == topic


# ---- refused before sending --------------------------------------------------------------
@pytest.mark.parametrize(
    ("message", "words"),
    [
        (OutgoingMessage(topic="t", body=b"x", deliver_at_ms=1), "delay_level"),
        (OutgoingMessage(topic="t", body=b"x", delay_level=0), "1..18"),
        (OutgoingMessage(topic="t", body=b"x", delay_level=19), "1..18"),
        (OutgoingMessage(topic="t", body=b""), "empty body"),
        (OutgoingMessage(topic="t", body=b"x", sharding_key=""), "non-empty"),
        (
            OutgoingMessage(topic="t", body=b"x", sharding_key="k", delay_level=2),
            "cannot be delayed",
        ),
        (OutgoingMessage(topic="t", body=b"x", properties={"__SHARDINGKEY": "k"}), "reserved"),
    ],
)
def test_what_the_backend_cannot_send_is_refused_with_what_to_do(
    backend: RocketMQBackend, message: OutgoingMessage, words: str
) -> None:
    sender = backend.create_sender(unique("pl_pg"))
    with pytest.raises(InvalidMessageError, match=words):
        sender.send(message)
    with pytest.raises(InvalidMessageError, match=words):
        sender.send_async(message)
    with pytest.raises(InvalidMessageError, match=words):
        sender.send_oneway(message)


def test_oversize_and_bad_batches_are_refused_before_sending(backend: RocketMQBackend) -> None:
    sender = backend.create_sender(unique("pl_pg"))
    limit = backend.max_message_size
    assert limit == 4 * 1024 * 1024  # a 4.9 broker's maxMessageSize (librocketmq's own is 128 KiB)
    with pytest.raises(InvalidMessageError, match="maximum message size"):
        sender.send(OutgoingMessage(topic="t", body=b"x" * (limit + 1)))
    # NUL bytes are sent base64-encoded (4/3 the size): the check counts what goes on the wire
    with pytest.raises(InvalidMessageError, match="maximum message size"):
        sender.send(OutgoingMessage(topic="t", body=b"\x00" * (limit // 4 * 3 + 3)))
    with pytest.raises(InvalidMessageError, match="maximum message size"):  # one of the batch
        sender.send_batch(
            [
                OutgoingMessage(topic="t", body=b"x"),
                OutgoingMessage(topic="t", body=b"x" * limit * 2),
            ]
        )
    with pytest.raises(InvalidMessageError, match="one topic"):
        sender.send_batch(
            [OutgoingMessage(topic="t", body=b"x"), OutgoingMessage(topic="u", body=b"x")]
        )
    with pytest.raises(InvalidMessageError, match="cannot be delayed"):
        sender.send_batch([OutgoingMessage(topic="t", body=b"x", delay_level=1)])
    with pytest.raises(InvalidMessageError, match="one by one"):
        sender.send_batch([OutgoingMessage(topic="t", body=b"x", sharding_key="k")])
    with pytest.raises(InvalidMessageError, match="at least one"):
        sender.send_batch([])
    assert sender.stats() == {"sent": 0, "failed": 0, "pending": 0, "shut_down": False}


# ---- closing -------------------------------------------------------------------------------
def test_close_waits_for_pending_async_sends(backend: RocketMQBackend, txmsg_broker: Any) -> None:
    topic = _topic(txmsg_broker, "pl_close")
    sender = backend.create_sender(unique("pl_pg"))
    sender.send(OutgoingMessage(topic=topic, body=b"warm"))  # routes known: sends go out at once
    futures = [
        sender.send_async(OutgoingMessage(topic=topic, body=f"c{i}".encode())) for i in range(200)
    ]
    sender.close(timeout=20)
    assert all(f.done() for f in futures)
    assert {f.result().send_status for f in futures} == {"SEND_OK"}
    assert sender.shut_down
    with pytest.raises(ProducerClosedError):
        sender.send(OutgoingMessage(topic=topic, body=b"late"))
    inbox = _consume(backend, topic)
    wait_until(lambda: len(inbox.bodies()) == 201, timeout=30)


def _paused(pid: int) -> Callable[[], None]:
    os.kill(pid, signal.SIGSTOP)
    return lambda: os.kill(pid, signal.SIGCONT)


def test_close_timeout_with_unanswered_sends_fails_them_and_leaves_the_client_running(
    backend: RocketMQBackend, txmsg_broker: Any
) -> None:
    """A broker that does not answer (SIGSTOP): close(timeout) must not hang or shut the client
    down under pending requests; the futures say the outcome is unknown; a later close finishes."""
    topic = _topic(txmsg_broker, "pl_stuck")
    sender = backend.create_sender(unique("pl_pg"))
    sender.send(OutgoingMessage(topic=topic, body=b"warm"))
    resume = _paused(txmsg_broker.proc.pid)
    try:
        future = sender.send_async(OutgoingMessage(topic=topic, body=b"stuck"))
        started = time.monotonic()
        sender.close(timeout=0.3)
        assert time.monotonic() - started < 2
        with pytest.raises(SendError, match="may or may not be stored"):
            future.result(timeout=1)
        assert not sender.shut_down
        assert sender in sender_module._STILL_RUNNING
    finally:
        resume()
    time.sleep(0.5)
    sender.close(timeout=20)
    assert sender.shut_down
    assert sender not in sender_module._STILL_RUNNING


def test_backend_close_closes_its_senders(txmsg_broker: Any, tmp_path: Any) -> None:
    be = _backend(txmsg_broker, tmp_path)
    topic = _topic(txmsg_broker, "pl_bclose")
    sender = be.create_sender(unique("pl_pg"))
    future = sender.send_async(OutgoingMessage(topic=topic, body=b"x"))
    be.close(timeout=20)
    assert future.result(timeout=0).send_status == "SEND_OK"
    assert sender.shut_down
