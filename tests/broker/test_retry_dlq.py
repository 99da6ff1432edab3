"""CONSUMER_SEND_MSG_BACK with the real client: retries through %RETRY%<group> and the schedule topic, then DLQ.

The fixture scales RocketMQ's delay levels down (``delay_scale``) so 16 retries take seconds, not hours.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from rocketmq.client import ConsumeStatus, Message
from txmsg_broker.codec import CONSUMER_SEND_MSG_BACK, PULL_MESSAGE, SEND_MESSAGE_V2
from txmsg_broker.message_codec import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    decode_messages,
)
from txmsg_broker.rawclient import call
from txmsg_broker.testing import Clients, create_topic, unique, wait_until
from txmsg_broker.topics import DLQ_PREFIX, RETRY_PREFIX


def _msg(topic: str, body: str) -> Message:
    msg = Message(topic)
    msg.set_keys(body)
    msg.set_tags("TagA")
    msg.set_body(body.encode())
    return msg


def test_retry_then_success_keeps_id_topic_and_counts(txmsg_broker):
    topic, group = unique("RetryT"), unique("CG")
    create_topic(txmsg_broker.namesrv_addr, topic)  # consumers start before the first send
    attempts: Counter[str] = Counter()
    lock = threading.Lock()

    def fail_twice(item):
        with lock:
            attempts[item.body.decode()] += 1
            n = attempts[item.body.decode()]
        return ConsumeStatus.CONSUME_SUCCESS if n > 2 else ConsumeStatus.RECONSUME_LATER

    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.producer()
        received = clients.consumer(group, topic, fail_twice)
        result = producer.send_sync(_msg(topic, "again"))
        wait_until(
            lambda: attempts["again"] >= 3,
            timeout=30,
            message=lambda: f"3 attempts; attempts: {attempts}",
        )
        assert [r.reconsume_times for r in received] == [0, 1, 2]
        assert {r.topic for r in received} == {
            topic
        }  # the client maps %RETRY% back via RETRY_TOPIC
        assert {r.msg_id for r in received} == {result.msg_id}
    retry = _pull_all(txmsg_broker, RETRY_PREFIX + group)
    assert [m.reconsume_times for m in retry] == [1, 2]
    assert all(m.properties[PROPERTY_RETRY_TOPIC] == topic for m in retry)
    assert all(m.properties[PROPERTY_ORIGIN_MESSAGE_ID] for m in retry)


def test_always_failing_consumer_ends_in_dlq(txmsg_broker_factory):
    """17 deliveries (reconsumeTimes 0..16), then %DLQ%<group>; nothing is delivered after that."""
    broker = txmsg_broker_factory(delay_scale=0.0001)
    topic, group = unique("DlqT"), unique("CG")
    create_topic(broker.namesrv_addr, topic)  # consumers start before the first send
    seen: list[int] = []
    lock = threading.Lock()

    def always_fail(item):
        with lock:
            seen.append(item.reconsume_times)
        return (
            ConsumeStatus.CONSUME_SUCCESS
            if item.body == b"marker"
            else ConsumeStatus.RECONSUME_LATER
        )

    with Clients(broker.namesrv_addr) as clients:
        producer = clients.producer()
        clients.consumer(group, topic, always_fail)
        msg_id = producer.send_sync(_msg(topic, "dead-1")).msg_id
        dlq = DLQ_PREFIX + group
        wait_until(
            lambda: len(_pull_all(broker, dlq)) == 1,
            timeout=60,
            message=lambda: f"one message in the DLQ; deliveries so far: {seen}",
        )
        (dead,) = _pull_all(broker, dlq)
        assert dead.plain_body() == b"dead-1"
        assert dead.uniq_key == msg_id
        assert dead.reconsume_times == 17
        assert dead.properties.get(PROPERTY_RETRY_TOPIC) == topic
        with lock:
            assert seen == list(range(17))
        # a later message is still delivered; the dead one is not
        producer.send_sync(_msg(topic, "marker"))
        wait_until(lambda: len(seen) >= 18, timeout=20)
        time.sleep(0.5)  # would be enough for dozens of (scaled) redeliveries
        with lock:
            assert seen[17:] == [0]


def test_batch_of_failures_all_reach_dlq(txmsg_broker_factory):
    """Several messages failing together (librocketmq hands a pulled batch to one callback and sends all of
    it back when the first fails) still all end in the DLQ, none is lost."""
    broker = txmsg_broker_factory(delay_scale=0.0001)
    topic, group = unique("DlqB"), unique("CG")
    create_topic(broker.namesrv_addr, topic)  # consumers start before the first send
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.producer()
        clients.consumer(group, topic, lambda item: ConsumeStatus.RECONSUME_LATER)
        bodies = sorted(f"dead-{i}" for i in range(5))
        for body in bodies:
            producer.send_sync(_msg(topic, body))
        dlq = DLQ_PREFIX + group
        wait_until(lambda: len(_pull_all(broker, dlq)) >= 5, timeout=60)
        dead = _pull_all(broker, dlq)
        assert sorted(m.plain_body().decode() for m in dead) == bodies
        assert {m.reconsume_times for m in dead} == {17}


def _pull_all(broker, topic: str) -> list:
    response = call(
        broker.broker_addr,
        PULL_MESSAGE,
        {
            "consumerGroup": "inspect",
            "topic": topic,
            "queueId": 0,
            "queueOffset": "0",
            "maxMsgNums": 32,
            "sysFlag": 0,
        },
    )
    return decode_messages(response.body) if response.code == 0 else []


def test_send_back_honours_max_reconsume_times_header(txmsg_broker):
    """A raw CONSUMER_SEND_MSG_BACK with maxReconsumeTimes=1: first back → retry, second → DLQ."""
    topic, group = unique("RawBack"), unique("CG")
    addr = txmsg_broker.broker_addr
    sent = call(
        addr,
        SEND_MESSAGE_V2,
        {
            "a": "PG",
            "b": topic,
            "c": "TBW102",
            "d": 4,
            "e": 0,
            "f": 0,
            "g": "0",
            "h": 0,
            "i": "UNIQ_KEY\x01ABC\x02",
            "j": "0",
            "k": "0",
            "l": 16,
            "m": "0",
        },
        body=b"payload",
    )
    assert sent.code == 0, sent.remark
    first = _pull_all(txmsg_broker, topic)[0]
    back = {
        "group": group,
        "offset": str(first.commit_log_offset),
        "delayLevel": 0,
        "originMsgId": "ABC",
        "originTopic": topic,
        "maxReconsumeTimes": 1,
        "unitMode": "0",
    }
    assert call(addr, CONSUMER_SEND_MSG_BACK, back).code == 0
    wait_until(lambda: len(_pull_all(txmsg_broker, RETRY_PREFIX + group)) == 1, timeout=20)
    retried = _pull_all(txmsg_broker, RETRY_PREFIX + group)[0]
    assert retried.reconsume_times == 1
    assert retried.plain_body() == b"payload"
    assert (
        call(addr, CONSUMER_SEND_MSG_BACK, {**back, "offset": str(retried.commit_log_offset)}).code
        == 0
    )
    dead = _pull_all(txmsg_broker, DLQ_PREFIX + group)
    assert len(dead) == 1
    assert dead[0].reconsume_times == 2
    assert dead[0].uniq_key == "ABC"
    # an unknown commit-log offset is an error the client can read, not a crash
    bad = call(addr, CONSUMER_SEND_MSG_BACK, {**back, "offset": "999999999"})
    assert bad.code == 1
    assert "offset" in (bad.remark or "")
