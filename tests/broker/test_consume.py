"""Push consumers of the real client against the embedded broker: delivery, tags, offsets across restarts."""

from __future__ import annotations

import threading
from collections import Counter

from click.testing import CliRunner
from rocketmq.client import ConsumeStatus, Message, Producer, PushConsumer
from txmsg_broker.cli import topic as topic_cli
from txmsg_broker.testing import (
    Clients,
    create_topic,
    enable_consumer_trace,
    set_producer_instance_name,
    unique,
    wait_until,
)


def _msg(topic: str, body: str, tags: str = "TagA", keys: str = "") -> Message:
    msg = Message(topic)
    msg.set_tags(tags)
    if keys:
        msg.set_keys(keys)
    msg.set_body(body.encode())
    return msg


def test_produce_then_consume_every_message_once(txmsg_broker):
    topic, group = unique("ConsT"), unique("CG")
    create_topic(txmsg_broker.namesrv_addr, topic)  # consumers start before the first send
    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.producer()
        sent = {f"m{i}" for i in range(40)}
        for body in sorted(sent):
            assert producer.send_sync(_msg(topic, body, keys=body)).status == 0
        received = clients.consumer(group, topic)
        wait_until(
            lambda: {r.body.decode() for r in received} >= sent,
            timeout=30,
            message=lambda: (
                f"all sent messages; missing {sent - {r.body.decode() for r in received}}"
            ),
        )
        # then new messages arrive through the long-polled pull
        later = {f"late{i}" for i in range(10)}
        for body in sorted(later):
            producer.send_sync(_msg(topic, body))
        wait_until(lambda: {r.body.decode() for r in received} >= sent | later, timeout=30)
        counts = Counter(r.body.decode() for r in received)
        assert max(counts.values()) == 1, f"duplicates: {[b for b, n in counts.items() if n > 1]}"
        assert all(r.topic == topic for r in received)
        assert {r.keys for r in received if r.body.decode() in sent} == sent


def test_tag_subscription_filters(txmsg_broker):
    topic, group = unique("TagT"), unique("CG")
    create_topic(txmsg_broker.namesrv_addr, topic)  # consumers start before the first send
    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.producer()
        received = clients.consumer(group, topic, expression="TagA || TagC")
        for i in range(9):
            producer.send_sync(_msg(topic, f"b{i}", tags=("TagA", "TagB", "TagC")[i % 3]))
        expected = {f"b{i}" for i in range(9) if i % 3 != 1}
        wait_until(lambda: {r.body.decode() for r in received} >= expected, timeout=30)
        producer.send_sync(_msg(topic, "marker", tags="TagC"))
        wait_until(lambda: any(r.body == b"marker" for r in received), timeout=30)
        assert {r.tags for r in received} <= {"TagA", "TagC"}
        assert len(received) == len(expected) + 1


def test_two_consumers_share_the_queues(txmsg_broker):
    """Two instances of one group rebalance (GET_CONSUMER_LIST_BY_GROUP + notify) and split the work."""
    topic, group = unique("ShareT"), unique("CG")
    create_topic(txmsg_broker.namesrv_addr, topic)  # consumers start before the first send
    lock = threading.Lock()
    seen: Counter[str] = Counter()

    def record(item):
        with lock:
            seen[item.body.decode()] += 1

    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.producer()
        first = clients.consumer(group, topic, record)
        second = clients.consumer(group, topic, record)
        bodies = {f"s{i}" for i in range(80)}
        # wait until the rebalance has split the 4 queues: then both receive
        wait_until(
            lambda: (
                _send_and_check(producer, topic, bodies, seen, lock)
                and bool(first)
                and bool(second)
            ),
            timeout=40,
            message=lambda: f"both instances to receive; first={len(first)} second={len(second)}",
        )
        with lock:
            assert set(seen) >= bodies


def _send_and_check(producer, topic, bodies, seen, lock) -> bool:
    with lock:
        missing = bodies - set(seen)
    if not missing:
        return True
    for body in sorted(missing)[:8]:
        producer.send_sync(_msg(topic, body))
    return False


def test_orderly_consumer_gets_each_queue_in_order(txmsg_broker):
    """Orderly push consumers lock their queues (LOCK_BATCH_MQ) and see each sharding key's messages in order."""
    topic, group = unique("OrderT"), unique("CG")
    lock = threading.Lock()
    seen: dict[str, list[int]] = {}

    def on_message(msg):
        key, _, seq = msg.body.decode().partition(":")
        with lock:
            seen.setdefault(key, []).append(int(seq))
        return ConsumeStatus.CONSUME_SUCCESS

    # Create the topic up front: an orderly send does not retry route discovery, so a topic
    # that is only auto-created by the first send races the client's route cache.
    created = CliRunner().invoke(
        topic_cli, ["create", topic, "--namesrv", txmsg_broker.namesrv_addr]
    )
    assert created.exit_code == 0, created.output

    producer = Producer(unique("PG"), orderly=True)
    set_producer_instance_name(producer, unique("inst"))
    producer.set_name_server_address(txmsg_broker.namesrv_addr)
    producer.start()
    consumer = PushConsumer(group, orderly=True)
    consumer.set_instance_name(unique("cinst"))
    consumer.set_name_server_address(txmsg_broker.namesrv_addr)
    consumer.subscribe(topic, on_message)
    enable_consumer_trace(consumer)
    try:
        consumer.start()
        enable_consumer_trace(consumer, on=False)
        for seq in range(30):
            for key in ("k1", "k2", "k3"):
                msg = _msg(topic, f"{key}:{seq}")
                assert producer.send_orderly_with_sharding_key(msg, key).status == 0
        wait_until(
            lambda: sum(len(v) for v in seen.values()) >= 90,
            timeout=40,
            message=lambda: f"90 deliveries; seen {seen}",
        )
        with lock:
            assert seen == {k: list(range(30)) for k in ("k1", "k2", "k3")}
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_large_compressed_bodies_and_retry_of_them(txmsg_broker):
    """Bodies >= 4 KiB travel zlib-compressed (sysFlag bit 0); consumers get them back intact, also via retry."""
    topic, group = unique("BigT"), unique("CG")
    create_topic(txmsg_broker.namesrv_addr, topic)  # consumers start before the first send
    big = ("0123456789abcdef" * 2048).encode()  # 32 KiB, compressible
    attempts: list[int] = []

    def fail_once(item):
        attempts.append(item.reconsume_times)
        return (
            ConsumeStatus.RECONSUME_LATER if len(attempts) == 1 else ConsumeStatus.CONSUME_SUCCESS
        )

    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.producer()
        received = clients.consumer(group, topic, fail_once)
        msg = Message(topic)
        msg.set_body(big)
        assert producer.send_sync(msg).status == 0
        wait_until(lambda: len(received) >= 2, timeout=30)
        assert [r.body for r in received[:2]] == [big, big]
        assert attempts[:2] == [0, 1]
