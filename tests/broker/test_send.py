"""Sends with the real client: properties, UNIQ_KEY, batch, zlib-compressed bodies, size limit."""

from __future__ import annotations

import ctypes
import os

import pytest
from rocketmq.client import Message, SendStatus
from rocketmq.exceptions import ProducerSendSyncFailed
from rocketmq.ffi import _CSendResult, dll
from txmsg_broker import codec
from txmsg_broker.message_codec import SYSFLAG_COMPRESSED, properties_to_string
from txmsg_broker.rawclient import call
from txmsg_broker.store import MessageStore
from txmsg_broker.testing import Clients, create_topic, read_log, unique, wait_until


def stored(data_dir, topic: str, queues: int = 4):
    with MessageStore(data_dir) as store:
        return [m for q in range(queues) for m in store.get(topic, q, 0, 1000)]


def test_send_and_consume_with_properties(txmsg_broker):
    topic = unique("SendT")
    create_topic(txmsg_broker.namesrv_addr, topic)  # consumers start before the first send
    with Clients(txmsg_broker.namesrv_addr) as clients:
        received = clients.consumer(unique("CgSend"), topic, properties=("color", "UNIQ_KEY"))
        producer = clients.producer()
        ids = {}
        for i in range(8):
            msg = Message(topic)
            msg.set_keys(f"key{i}")
            msg.set_tags("TagA")
            msg.set_property("color", f"c{i}")
            msg.set_body(f"hello {i}".encode())
            result = producer.send_sync(msg)
            assert result.status == SendStatus.OK
            ids[f"key{i}"] = result.msg_id
        wait_until(lambda: len(received) >= 8, timeout=20)
        by_key = {r.keys: r for r in received}
        assert sorted(by_key) == sorted(ids)
        for key, item in by_key.items():
            i = key.removeprefix("key")
            assert item.body == f"hello {i}".encode()
            assert item.tags == "TagA"
            assert item.properties["color"] == f"c{i}"
            assert item.msg_id == ids[key] == item.properties["UNIQ_KEY"]
            assert item.topic == topic


def test_librocketmq_batch_is_stored_as_one_message_like_a_real_broker_does(txmsg_broker):
    """librocketmq 2.1.0 flags its batch request ``m=1``; real 4.9.8 and 5.3.3 read header
    booleans with Java's ``Boolean.parseBoolean`` (only "true"), so they store the encoded batch as
    a single message (seen on a real 4.9.8: one message in one queue, an empty body to the
    consumer).  The embedded broker does the same; txmsg's rocketmq backend therefore sends a
    batch one by one (docs/rocketmq-facts.md, "Suites against real brokers")."""
    topic = unique("BatchT")
    create_topic(txmsg_broker.namesrv_addr, topic)  # consumers start before the first send
    with Clients(txmsg_broker.namesrv_addr) as clients:
        received = clients.consumer(unique("BatchCG"), topic)
        producer = clients.producer()
        batch = dll.CreateBatchMessage()
        keep = []
        for i in range(5):
            msg = Message(topic)
            msg.set_keys(f"b{i}")
            msg.set_body(f"batch {i}".encode())
            keep.append(msg)
            assert dll.AddMessage(batch, msg) == 0
        result = _CSendResult()
        assert dll.SendBatchMessage(producer._handle, batch, ctypes.pointer(result)) == 0
        dll.DestroyBatchMessage(batch)
        assert result.sendStatus == 0
        wait_until(lambda: len(received) >= 1, timeout=20)
    txmsg_broker.stop()
    rows = stored(txmsg_broker.data_dir, topic)
    assert len(rows) == 1  # not five: the batch flag "1" is not Java's "true"
    assert b"batch 0" in rows[0].body  # the encoded batch, first entry ...
    assert b"batch 4" in rows[0].body  # ... and last


def test_compressed_body_is_stored_compressed_and_delivered_inflated(txmsg_broker):
    topic = unique("ZipT")
    create_topic(txmsg_broker.namesrv_addr, topic)  # consumers start before the first send
    body = b"compress me please " * 5000  # ≥ 4 KiB (compressed by the client), < its 128 KiB limit
    with Clients(txmsg_broker.namesrv_addr) as clients:
        received = clients.consumer(unique("ZipCG"), topic)
        producer = clients.producer()
        msg = Message(topic)
        msg.set_body(body)
        assert producer.send_sync(msg).status == SendStatus.OK
        wait_until(lambda: len(received) == 1, timeout=20)
        assert received[0].body == body
    txmsg_broker.stop()
    (row,) = stored(txmsg_broker.data_dir, topic)
    assert row.sys_flag & SYSFLAG_COMPRESSED
    assert len(row.body) < len(body) // 10
    assert row.plain_body() == body


def incompressible(size: int) -> bytes:
    # no NUL bytes: the wrapper passes bodies as C strings
    return bytes(b % 255 + 1 for b in os.urandom(size))


def test_oversized_message_is_rejected_with_message_illegal(txmsg_broker):
    topic = unique("BigT")
    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.producer(max_message_size=16 * 1024 * 1024)
        ok = Message(topic)
        ok.set_body(b"small")
        assert producer.send_sync(ok).status == SendStatus.OK
        big = Message(topic)
        big.set_body(incompressible(4 * 1024 * 1024 + 4096))
        with pytest.raises(ProducerSendSyncFailed):  # a message over 4 MiB is rejected
            producer.send_sync(big)
    log = read_log(txmsg_broker.log_dir, "broker.log")
    assert "(code 13)" in log
    assert "exceeds the broker's maxMessageSize 4194304 bytes" in log
    # raw request: the response code and remark are what a client sees
    ext = {
        "a": "PG",
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": 0,
        "f": 0,
        "g": "1",
        "h": 0,
        "i": properties_to_string({"UNIQ_KEY": "X"}),
        "j": "0",
        "k": "0",
        "l": 16,
        "m": "0",
    }
    response = call(
        txmsg_broker.broker_addr, codec.SEND_MESSAGE_V2, ext, b"x" * (4 * 1024 * 1024 + 1)
    )
    assert response.code == codec.MESSAGE_ILLEGAL
    assert "maxMessageSize" in (response.remark or "")
    at_limit = call(txmsg_broker.broker_addr, codec.SEND_MESSAGE_V2, ext, b"x" * (4 * 1024 * 1024))
    assert at_limit.code == codec.SUCCESS
    assert set(at_limit.ext_fields) >= {"msgId", "queueId", "queueOffset"}


def test_raw_send_validates_header_fields_and_keeps_serving(txmsg_broker):
    topic = unique("RawT")
    good = {
        "a": "PG",
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": 1,
        "f": 0,
        "g": "1",
        "h": 0,
        "i": properties_to_string({"UNIQ_KEY": "ABC", "KEYS": "k"}),
        "j": "0",
        "k": "0",
        "l": 16,
        "m": "0",
    }
    response = call(txmsg_broker.broker_addr, codec.SEND_MESSAGE_V2, good, b"body")
    assert response.code == codec.SUCCESS
    assert response.ext_fields["queueId"] == "1"
    assert response.ext_fields["queueOffset"] == "0"
    assert len(response.ext_fields["msgId"]) == 32
    bad_queue = dict(good, e="not-a-number")
    response = call(txmsg_broker.broker_addr, codec.SEND_MESSAGE_V2, bad_queue, b"body")
    assert response.code == codec.SYSTEM_ERROR
    assert "queueId" in (response.remark or "")
    out_of_range = dict(good, e=99)
    assert (
        call(txmsg_broker.broker_addr, codec.SEND_MESSAGE_V2, out_of_range, b"x").code
        == codec.SYSTEM_ERROR
    )
    system_topic = dict(good, b="RMQ_SYS_TRANS_HALF_TOPIC")
    assert (
        call(txmsg_broker.broker_addr, codec.SEND_MESSAGE_V2, system_topic, b"x").code
        == codec.NO_PERMISSION
    )
    # V1 names work too
    v1 = {
        "producerGroup": "PG",
        "topic": topic,
        "queueId": "1",
        "sysFlag": "0",
        "bornTimestamp": "1",
        "flag": "0",
        "properties": "",
        "reconsumeTimes": "0",
    }
    response = call(txmsg_broker.broker_addr, codec.SEND_MESSAGE, v1, b"v1")
    assert response.code == codec.SUCCESS
    assert response.ext_fields["queueOffset"] == "1"
    txmsg_broker.stop()
    rows = stored(txmsg_broker.data_dir, topic)
    assert [(m.body, m.queue_offset) for m in rows] == [(b"body", 0), (b"v1", 1)]
    # CLUSTER: a real broker puts its cluster name on every message it stores (tests/broker/test_discard.py)
    assert rows[0].properties == {"UNIQ_KEY": "ABC", "KEYS": "k", "CLUSTER": "DefaultCluster"}
