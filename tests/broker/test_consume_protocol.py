"""Consumer-side protocol details on raw sockets: long-poll wake-up, pull result codes, offsets, membership
notifications, orderly locks. (The real client is exercised in test_consume.py; these pin the wire answers.)"""

from __future__ import annotations

import json
import threading
import time

from txmsg_broker.app import EmbeddedBroker
from txmsg_broker.codec import (
    GET_CONSUMER_LIST_BY_GROUP,
    GET_MAX_OFFSET,
    GET_MIN_OFFSET,
    GET_ROUTEINFO_BY_TOPIC,
    HEART_BEAT,
    LOCK_BATCH_MQ,
    NOTIFY_CONSUMER_IDS_CHANGED,
    PULL_MESSAGE,
    PULL_NOT_FOUND,
    PULL_OFFSET_MOVED,
    PULL_RETRY_IMMEDIATELY,
    QUERY_CONSUMER_OFFSET,
    SEND_MESSAGE_V2,
    TOPIC_NOT_EXIST,
    UNLOCK_BATCH_MQ,
    UPDATE_CONSUMER_OFFSET,
    RemotingCommand,
)
from txmsg_broker.config import BrokerConfig
from txmsg_broker.membership import CHANNEL_EXPIRED_MS
from txmsg_broker.message_codec import decode_messages
from txmsg_broker.rawclient import call, connect, read_command
from txmsg_broker.testing import create_topic, unique, wait_until


def send(
    addr: str, topic: str, body: bytes, *, queue_id: int = 0, tags: str = ""
) -> RemotingCommand:
    props = f"UNIQ_KEY\x01{unique('K')}\x02" + (f"TAGS\x01{tags}\x02" if tags else "")
    r = call(
        addr,
        SEND_MESSAGE_V2,
        {
            "a": "PG",
            "b": topic,
            "c": "TBW102",
            "d": 4,
            "e": queue_id,
            "f": 0,
            "g": "0",
            "h": 0,
            "i": props,
            "j": "0",
            "k": "0",
            "l": 16,
            "m": "0",
        },
        body,
    )
    assert r.code == 0, r.remark
    return r


def pull_fields(
    topic: str, offset: int, *, sys_flag: int = 0, sub: str = "*", suspend: int = 15000
) -> dict:
    return {
        "consumerGroup": "g",
        "topic": topic,
        "queueId": 0,
        "queueOffset": str(offset),
        "maxMsgNums": 32,
        "sysFlag": sys_flag,
        "commitOffset": "0",
        "subVersion": "0",
        "suspendTimeoutMillis": str(suspend),
        "subscription": sub,
    }


def test_held_pull_is_woken_by_a_new_message(txmsg_broker):
    addr, topic = txmsg_broker.broker_addr, unique("HoldT")
    send(addr, topic, b"first")
    with connect(
        addr, timeout=10
    ) as sock:  # far below the 20 s hold: only a wake-up answers in time
        sock.sendall(
            RemotingCommand.request(
                PULL_MESSAGE, pull_fields(topic, 1, sys_flag=2, suspend=20000), opaque=3
            ).encode()
        )
        threading.Timer(0.5, send, args=(addr, topic, b"second")).start()
        answer = read_command(sock)
    assert answer.code == 0
    assert answer.opaque == 3
    assert [m.plain_body() for m in decode_messages(answer.body)] == [b"second"]
    assert answer.ext_fields["nextBeginOffset"] == "2"
    assert all(isinstance(v, str) for v in answer.ext_fields.values())


def test_pull_result_codes_follow_java(txmsg_broker):
    addr, topic = txmsg_broker.broker_addr, unique("CodesT")
    unknown = call(addr, PULL_MESSAGE, pull_fields(topic, 0))
    assert unknown.code == TOPIC_NOT_EXIST
    assert "txmsg topic create" in (unknown.remark or "")
    assert (
        call(txmsg_broker.namesrv_addr, GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).code
        == TOPIC_NOT_EXIST
    )
    create_topic(txmsg_broker.namesrv_addr, topic)  # a route query creates nothing (as 4.9.8)
    empty = call(addr, PULL_MESSAGE, pull_fields(topic, 0))
    assert (empty.code, empty.ext_fields["nextBeginOffset"]) == (PULL_NOT_FOUND, "0")
    moved = call(addr, PULL_MESSAGE, pull_fields(topic, 5))
    assert (moved.code, moved.ext_fields["nextBeginOffset"]) == (PULL_OFFSET_MOVED, "0")
    for i, tag in enumerate(("TagA", "TagB", "TagB")):
        send(addr, topic, f"m{i}".encode(), tags=tag)
    found = call(addr, PULL_MESSAGE, pull_fields(topic, 0, sub="TagA"))
    assert found.code == 0
    assert found.ext_fields["nextBeginOffset"] == "3"
    assert [m.plain_body() for m in decode_messages(found.body)] == [b"m0"]
    unmatched = call(addr, PULL_MESSAGE, pull_fields(topic, 1, sub="TagA || TagC"))
    assert (unmatched.code, unmatched.ext_fields["nextBeginOffset"]) == (
        PULL_RETRY_IMMEDIATELY,
        "3",
    )
    at_end = call(addr, PULL_MESSAGE, pull_fields(topic, 3))
    assert (at_end.code, at_end.ext_fields["nextBeginOffset"], at_end.ext_fields["maxOffset"]) == (
        PULL_NOT_FOUND,
        "3",
        "3",
    )
    beyond = call(addr, PULL_MESSAGE, pull_fields(topic, 9))
    assert (beyond.code, beyond.ext_fields["nextBeginOffset"]) == (PULL_OFFSET_MOVED, "3")
    assert call(addr, GET_MAX_OFFSET, {"topic": topic, "queueId": 0}).ext_fields["offset"] == "3"
    assert call(addr, GET_MIN_OFFSET, {"topic": topic, "queueId": 0}).ext_fields["offset"] == "0"


def test_offsets_update_query_and_commit_flag(txmsg_broker):
    addr, topic = txmsg_broker.broker_addr, unique("OffT")
    q = {"consumerGroup": "g", "topic": topic, "queueId": 0}
    assert (
        call(addr, QUERY_CONSUMER_OFFSET, q).ext_fields["offset"] == "0"
    )  # new group: from the start
    with connect(
        addr
    ) as sock:  # oneway update (as the client sends it), then a query on the same connection
        sock.sendall(
            RemotingCommand.request(
                UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": "7"}, opaque=1, oneway=True
            ).encode()
        )
        sock.sendall(RemotingCommand.request(QUERY_CONSUMER_OFFSET, q, opaque=2).encode())
        answer = read_command(sock)
    assert answer.opaque == 2
    assert answer.ext_fields["offset"] == "7"
    # a pull with the commit-offset flag stores the client's committed offset too
    create_topic(txmsg_broker.namesrv_addr, topic)
    call(addr, PULL_MESSAGE, {**pull_fields(topic, 0, sys_flag=1), "commitOffset": "9"})
    assert call(addr, QUERY_CONSUMER_OFFSET, q).ext_fields["offset"] == "9"


def _heartbeat(sock, client_id: str, group: str, opaque: int) -> None:
    body = json.dumps(
        {
            "clientID": client_id,
            "consumerDataSet": [
                {
                    "groupName": group,
                    "consumeType": 1,
                    "messageModel": 1,
                    "consumeFromWhere": 0,
                    "subscriptionDataSet": [{"topic": "T", "subString": "*", "subVersion": "1"}],
                }
            ],
        }
    ).encode()
    sock.sendall(RemotingCommand.request(HEART_BEAT, {}, body, opaque=opaque).encode())


def _next(sock, predicate) -> RemotingCommand:
    while True:
        cmd = read_command(sock)
        if predicate(cmd):
            return cmd


def test_group_changes_notify_members_and_update_the_list(txmsg_broker):
    addr, group = txmsg_broker.broker_addr, unique("CG")
    a = connect(addr)
    b = connect(addr)
    _heartbeat(a, "10.0.0.1@1#A", group, 1)
    _next(a, lambda c: c.is_response and c.opaque == 1)
    _heartbeat(b, "10.0.0.1@2#B", group, 1)
    notify = _next(a, lambda c: not c.is_response and c.code == NOTIFY_CONSUMER_IDS_CHANGED)
    assert notify.ext_fields == {"consumerGroup": group}
    assert notify.is_oneway
    listing = call(addr, GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    assert json.loads(listing.body) == {"consumerIdList": ["10.0.0.1@1#A", "10.0.0.1@2#B"]}
    b.close()
    _next(a, lambda c: not c.is_response and c.code == NOTIFY_CONSUMER_IDS_CHANGED)
    listing = call(addr, GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    assert json.loads(listing.body)["consumerIdList"] == ["10.0.0.1@1#A"]
    a.close()
    assert call(addr, GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}).code != 0


def test_orderly_locks_are_exclusive_per_client(txmsg_broker):
    addr, group = txmsg_broker.broker_addr, unique("CG")
    mqs = [{"topic": "T", "brokerName": "broker-a", "queueId": q} for q in range(2)]

    def lock(client: str, which) -> list:
        body = json.dumps({"consumerGroup": group, "clientId": client, "mqSet": which}).encode()
        return json.loads(call(addr, LOCK_BATCH_MQ, body=body).body)["lockOKMQSet"]

    assert lock("c1", mqs[:1]) == mqs[:1]
    assert lock("c2", mqs) == mqs[1:]  # queue 0 belongs to c1
    assert lock("c1", mqs[:1]) == mqs[:1]  # re-locking your own queue is fine
    body = json.dumps({"consumerGroup": group, "clientId": "c1", "mqSet": mqs[:1]}).encode()
    assert call(addr, UNLOCK_BATCH_MQ, body=body).code == 0
    assert lock("c2", mqs) == mqs


def test_an_orderly_lock_not_renewed_comes_free_after_its_live_time(txmsg_broker_factory):
    """``--rebalance-lock-max-live-time-ms`` (Java: ``rocketmq.broker.rebalance.lockMaxLiveTime``, 60 s):
    a holder that stops renewing (a crashed client) loses its queue to the next client after it
    (while it lives, it is exclusive: ``test_orderly_locks_are_exclusive_per_client``)."""
    assert BrokerConfig().rebalance_lock_max_live_time_ms == 60000  # the real broker's default
    broker = txmsg_broker_factory(rebalance_lock_max_live_time_ms=300)
    addr, group = broker.broker_addr, unique("CG")
    mq = [{"topic": "T", "brokerName": "broker-a", "queueId": 0}]

    def lock(client: str) -> list:
        body = json.dumps({"consumerGroup": group, "clientId": client, "mqSet": mq}).encode()
        return json.loads(call(addr, LOCK_BATCH_MQ, body=body).body)["lockOKMQSet"]

    assert lock("c1") == mq
    wait_until(lambda: lock("c2") == mq, timeout=30, message="c1's lock to expire")


def test_silent_consumer_channels_expire(tmp_path):
    """A consumer without heartbeats for 120 s loses its membership and its connection (Java's scan)."""
    with EmbeddedBroker(tmp_path / "data", tmp_path / "logs") as broker:
        group = unique("CG")
        with connect(broker.broker_addr) as sock:  # closed by the broker; ours closed too
            _heartbeat(sock, "10.0.0.1@1#A", group, 1)
            _next(sock, lambda c: c.is_response and c.opaque == 1)
            now = int(time.time() * 1000)
            assert broker.call(lambda b: b.consumers.membership.expire_channels(now)) == 0
            assert (
                broker.call(
                    lambda b: b.consumers.membership.expire_channels(
                        now + CHANNEL_EXPIRED_MS + 5000
                    )
                )
                == 1
            )
            sock.settimeout(5)
            try:  # frames sent before the expiry (its own membership notification) may still be queued
                while True:
                    assert not read_command(sock).is_response
            except ConnectionError:
                pass
        assert (
            call(broker.broker_addr, GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}).code != 0
        )


def test_held_pull_is_released_when_its_client_disconnects(tmp_path):
    with EmbeddedBroker(tmp_path / "data", tmp_path / "logs") as broker:
        topic = unique("GoneT")
        create_topic(broker.namesrv_addr, topic)
        held = lambda: broker.call(lambda b: b.consumers.long_polls.held())  # noqa: E731
        sock = connect(broker.broker_addr)
        sock.sendall(
            RemotingCommand.request(
                PULL_MESSAGE, pull_fields(topic, 0, sys_flag=2, suspend=20000), opaque=4
            ).encode()
        )
        wait_until(lambda: held() == 1, timeout=5)
        sock.close()
        wait_until(lambda: held() == 0, timeout=5, message="the hold to end with its connection")
