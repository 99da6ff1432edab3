"""A half message checked ``transactionCheckMax`` times is discarded exactly as real brokers do
(issue 39.3; docs/rocketmq-facts.md, "What a discard stores, and who can read it").

What real 4.9.8 and 5.3.3 did (2026-11-29, one transaction answered UNKNOW at send and at every
check-back, the copy read back with a raw PULL and a librocketmq push consumer):

* the copy goes to queue 0 of ``TRANS_CHECK_MAX_TIME_TOPIC`` (created at the first discard, one
  queue, perm 6) and keeps the last half copy's body, flag, sys flag, born timestamp and host and
  every property, ``TRANSACTION_CHECK_TIMES=3`` included; ``CLUSTER`` is there because the broker
  puts it on every send; 5.3.3 adds ``MSG_REGION``, ``TRACE_ON`` and ``__transactionId__``, and a
  message sent over gRPC carries the proxy's ``__BORNHOST``, ``BORN_TIMESTAMP``, ``RECONSUME_TIME``
  and its topic as ``PGROUP``;
* nothing is written to the op queue;
* a remoting consumer group reads the copy; the 5.x proxy refuses the topic over gRPC
  (``ILLEGAL_TOPIC`` "cannot access system topic" from QueryRoute, so the official SimpleConsumer
  cannot fetch its route).

The property sets asserted below are the ones the real brokers stored, key for key.  The tests run
on the manual clock: three check-backs and the discard cost no wall time.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from rocketmq.client import Message, TransactionStatus
from txmsg_broker import fastjson
from txmsg_broker.codec import GET_MAX_OFFSET, GET_ROUTEINFO_BY_TOPIC, PULL_MESSAGE, SUCCESS
from txmsg_broker.message_codec import StoredMessage, decode_messages
from txmsg_broker.rawclient import call
from txmsg_broker.testing import Clients, create_topic, has_route, unique, wait_until
from txmsg_broker.topics import CHECK_MAX_TIME_TOPIC, HALF_TOPIC, OP_HALF_TOPIC

#: the shared scripts' real-broker settings (transactionCheckMax=3, timeout and interval 2 s)
SETTINGS: dict[str, Any] = {
    "check_max": 3,
    "transaction_timeout_ms": 2000,
    "check_interval_ms": 2000,
}
#: PullSysFlag.FLAG_SUBSCRIPTION: the pull carries its own subscription ("*"), no group needed
PULL_WITH_SUBSCRIPTION = 0x4
KEY, TAG, USER_PROPERTY = "discard-key-1", "discardTag", ("shop", "42")
UNKNOW = TransactionStatus.UNKNOWN


def max_offset(broker_addr: str, topic: str) -> int:
    """GET_MAX_OFFSET of queue 0; -1 while the topic does not exist."""
    response = call(broker_addr, GET_MAX_OFFSET, {"topic": topic, "queueId": "0"})
    return int(response.ext_fields["offset"]) if response.code == SUCCESS else -1


def pull(broker_addr: str, topic: str) -> list[StoredMessage]:
    """Every message of queue 0, as stored (a raw PULL: all fields, all properties)."""
    found: list[StoredMessage] = []
    while True:
        response = call(
            broker_addr,
            PULL_MESSAGE,
            {
                "consumerGroup": "DiscardRawReader",
                "topic": topic,
                "queueId": "0",
                "queueOffset": str(len(found)),
                "maxMsgNums": "32",
                "sysFlag": str(PULL_WITH_SUBSCRIPTION),
                "commitOffset": "0",
                "suspendTimeoutMillis": "0",
                "subscription": "*",
                "subVersion": "0",
                "expressionType": "TAG",
            },
        )
        if response.code != SUCCESS:
            return found
        found += decode_messages(response.body)


def advance_until_discarded(broker: Any, *, steps: int = 12) -> None:
    """Advance the manual clock one check interval at a time until the discard topic has a message:
    a check-back per pass (answered before ``advance`` returns), then the discard."""
    for _ in range(steps):
        broker.advance(SETTINGS["check_interval_ms"] / 1000)
        if max_offset(broker.broker_addr, CHECK_MAX_TIME_TOPIC) > 0:
            return
    raise AssertionError(f"no discard after {steps} check intervals")


def assert_copy_of_last_half(copy: StoredMessage, halves: list[StoredMessage]) -> None:
    """The discarded copy is the last check-back copy of the half message, moved: same body, flag,
    sys flag, born timestamp and host, reconsume times, store host and properties."""
    last = halves[-1]
    assert last.properties["TRANSACTION_CHECK_TIMES"] == str(SETTINGS["check_max"])
    assert (copy.topic, copy.queue_id, copy.queue_offset) == (CHECK_MAX_TIME_TOPIC, 0, 0)
    for name in (
        "body",
        "flag",
        "sys_flag",
        "born_timestamp",
        "born_host",
        "reconsume_times",
        "store_host",
        "properties",
    ):
        assert getattr(copy, name) == getattr(last, name), name
    assert copy.store_timestamp >= last.store_timestamp
    assert copy.prepared_transaction_offset == 0


def assert_routed_like_java(namesrv_addr: str) -> None:
    """``createTopicOfTranCheckMaxTime(1, PERM_READ | PERM_WRITE)``: one queue, perm 6."""
    response = call(namesrv_addr, GET_ROUTEINFO_BY_TOPIC, {"topic": CHECK_MAX_TIME_TOPIC})
    assert response.code == SUCCESS, response.remark
    (queue,) = fastjson.loads(response.body)["queueDatas"]
    assert (queue["readQueueNums"], queue["writeQueueNums"], queue["perm"]) == (1, 1, 6)


@pytest.mark.txmsg_manual_clock(**SETTINGS)
@pytest.mark.parametrize("version", ["4.9.8", "5.3.3"])
def test_a_discarded_remoting_half_message_keeps_what_real_brokers_keep(
    txmsg_broker_factory, version
):
    broker = txmsg_broker_factory(broker_version=version)
    topic, group = unique("DiscardT"), unique("DiscardPG")
    create_topic(broker.namesrv_addr, topic, queues=1)
    checks: list[str] = []
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(
            group, lambda m: checks.append(m.get_property("TRANSACTION_CHECK_TIMES")) or UNKNOW
        )
        msg = Message(topic)
        msg.set_keys(KEY)
        msg.set_tags(TAG)
        msg.set_property(*USER_PROPERTY)
        msg.set_body(b"discard-body")
        sent = producer.send_message_in_transaction(msg, lambda m, a: UNKNOW)
        clients.heartbeat(producer)
        assert not has_route(broker.namesrv_addr, CHECK_MAX_TIME_TOPIC)  # not before a discard
        advance_until_discarded(broker)
        assert [c.decode() if isinstance(c, bytes) else c for c in checks] == ["1", "2", "3"]

        (copy,) = pull(broker.broker_addr, CHECK_MAX_TIME_TOPIC)
        halves = [h for h in pull(broker.broker_addr, HALF_TOPIC) if h.uniq_key == sent.msg_id]
        assert [h.properties.get("TRANSACTION_CHECK_TIMES") for h in halves] == [
            None,
            "1",
            "2",
            "3",
        ]
        assert_copy_of_last_half(copy, halves)
        expected = {
            "KEYS": KEY,
            "TAGS": TAG,
            USER_PROPERTY[0]: USER_PROPERTY[1],
            "TRAN_MSG": "true",
            "PGROUP": group,
            "UNIQ_KEY": sent.msg_id,
            "WAIT": "true",
            "CLUSTER": "DefaultCluster",
            "REAL_TOPIC": topic,
            "REAL_QID": "0",
            "TRANSACTION_CHECK_TIMES": "3",
        }
        if version == "5.3.3":
            expected |= {
                "MSG_REGION": "DefaultRegion",
                "TRACE_ON": "true",
                "__transactionId__": sent.msg_id,
            }
        assert copy.properties == expected
        assert (copy.body, copy.flag, copy.sys_flag) == (b"discard-body", 0, 0)
        assert max_offset(broker.broker_addr, OP_HALF_TOPIC) == 0  # no op record for a discard
        assert_routed_like_java(broker.namesrv_addr)

        # a consumer group reads it over remoting, properties and all
        names = tuple(expected)
        read = clients.consumer_when_routed(
            unique("DiscardReaderCG"), CHECK_MAX_TIME_TOPIC, properties=names
        )
        wait_until(lambda: len(read) == 1, timeout=30, message="the discarded copy at a consumer")
        (got,) = read
        assert (got.topic, got.keys, got.tags, got.body) == (
            CHECK_MAX_TIME_TOPIC,
            KEY,
            TAG,
            b"discard-body",
        )
        assert got.msg_id == sent.msg_id  # librocketmq shows the UNIQ_KEY
        assert got.properties == expected


@pytest.mark.txmsg_manual_clock(**SETTINGS)
def test_a_grpc_half_message_discarded_is_served_over_remoting_and_refused_over_grpc(
    txmsg_grpc_broker,
):
    import grpc  # noqa: PLC0415 - the gRPC extra
    from txmsg_broker.grpc.stubs import pb, svc, svc_grpc  # noqa: PLC0415
    from txmsg_rocketmq5._client import (  # noqa: PLC0415 - the 5.x client's names
        ClientConfiguration,
        Credentials,
        FilterExpression,
        Producer,
        SimpleConsumer,
        TransactionChecker,
        TransactionResolution,
    )
    from txmsg_rocketmq5._client import Message as Message5  # noqa: PLC0415

    broker = txmsg_grpc_broker
    topic = unique("DiscardG")
    create_topic(broker.namesrv_addr, topic, queues=1, message_type="TRANSACTION")
    checks = threading.Semaphore(0)

    class Unknown(TransactionChecker):  # type: ignore[misc]
        def check(self, message: Any) -> Any:
            checks.release()
            return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED

    config = ClientConfiguration(broker.grpc_endpoint, Credentials())
    producer = Producer(config, (topic,), Unknown())
    producer.startup()
    try:
        message = Message5()
        message.topic, message.body, message.tag, message.keys = topic, b"grpc-body", TAG, KEY
        message.add_property(*USER_PROPERTY)
        receipt = producer.send(message, producer.begin_transaction())  # never ended
        advance_until_discarded(broker)
    finally:
        producer.shutdown()
    assert sum(checks.acquire(blocking=False) for _ in range(10)) == 3

    (copy,) = pull(broker.broker_addr, CHECK_MAX_TIME_TOPIC)
    uniq = receipt.message_id
    halves = [h for h in pull(broker.broker_addr, HALF_TOPIC) if h.uniq_key == uniq]
    assert_copy_of_last_half(copy, halves)
    props = dict(copy.properties)
    born_host = props.pop("__BORNHOST")  # the client's own address, as the 5.x client reports it
    assert born_host
    assert props == {
        "KEYS": KEY,
        "TAGS": TAG,
        USER_PROPERTY[0]: USER_PROPERTY[1],
        "UNIQ_KEY": uniq,
        "TRAN_MSG": "true",
        "RECONSUME_TIME": "0",
        "PGROUP": topic,  # a 5.x proxy takes the topic as the producer group
        "BORN_TIMESTAMP": str(copy.born_timestamp),
        "CLUSTER": "DefaultCluster",
        "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
        "__transactionId__": uniq,
        "REAL_TOPIC": topic,
        "REAL_QID": "0",
        "TRANSACTION_CHECK_TIMES": "3",
    }
    assert max_offset(broker.broker_addr, OP_HALF_TOPIC) == 0

    # remoting: a consumer group reads it
    with Clients(broker.namesrv_addr) as clients:
        read = clients.consumer_when_routed(
            unique("DiscardGReaderCG"), CHECK_MAX_TIME_TOPIC, properties=("REAL_TOPIC",)
        )
        wait_until(lambda: len(read) == 1, timeout=30, message="the discarded copy at a consumer")
        assert (read[0].keys, read[0].properties["REAL_TOPIC"]) == (KEY, topic)

    # gRPC: refused as the 5.3.3 proxy refuses it (GrpcValidator.validateTopic)
    host, _, port = broker.grpc_endpoint.rpartition(":")
    endpoints = pb.Endpoints(
        scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))]
    )
    with grpc.insecure_channel(broker.grpc_endpoint) as channel:
        route = svc_grpc.MessagingServiceStub(channel).QueryRoute(
            svc.QueryRouteRequest(
                topic=pb.Resource(name=CHECK_MAX_TIME_TOPIC), endpoints=endpoints
            ),
            metadata=[("x-mq-client-id", unique("probe")), ("x-mq-language", "PYTHON")],
            timeout=10,
        )
    assert (route.status.code, route.status.message) == (
        pb.Code.ILLEGAL_TOPIC,
        "cannot access system topic",
    )
    assert len(route.message_queues) == 0
    # ClientActivity validates only the group of a subscription: its settings are accepted
    settings = pb.Settings(
        client_type=pb.ClientType.SIMPLE_CONSUMER,
        access_point=endpoints,
        subscription=pb.Subscription(
            group=pb.Resource(name=unique("DiscardSettingsCG")),
            subscriptions=[
                pb.SubscriptionEntry(
                    topic=pb.Resource(name=CHECK_MAX_TIME_TOPIC),
                    expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
                )
            ],
        ),
    )
    with grpc.insecure_channel(broker.grpc_endpoint) as channel:
        stream = svc_grpc.MessagingServiceStub(channel).Telemetry(
            iter([svc.TelemetryCommand(settings=settings)]),
            metadata=[("x-mq-client-id", unique("probe")), ("x-mq-language", "PYTHON")],
            timeout=10,
        )
        answer = next(stream)
        stream.cancel()
    assert answer.status.code == pb.Code.OK, answer.status.message
    consumer = SimpleConsumer(
        config,
        unique("DiscardGrpcCG"),
        {CHECK_MAX_TIME_TOPIC: FilterExpression()},
        await_duration=1,
    )
    consumer.startup()  # as on 5.3.3: the settings name only the group, which is valid
    try:
        with pytest.raises(Exception, match=f"failed to fetch topic:{CHECK_MAX_TIME_TOPIC} route"):
            consumer.receive(16, 15)
    finally:
        consumer.shutdown()


@pytest.mark.txmsg_manual_clock(check_max=3, file_reserved_time=0)
def test_a_half_message_past_file_reserved_time_is_discarded_with_its_count_raised(
    txmsg_broker_factory,
):
    """Java asks ``needDiscard`` (which raises ``TRANSACTION_CHECK_TIMES`` in memory, absent = 1)
    before ``needSkip``: the copy discarded for its age carries the raised count."""
    broker = txmsg_broker_factory(broker_version="4.9.8")
    topic = unique("DiscardOld")
    create_topic(broker.namesrv_addr, topic, queues=1)
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(unique("DiscardOldPG"), lambda m: UNKNOW)
        msg = Message(topic)
        msg.set_keys("OLD")
        msg.set_body(b"old")
        producer.send_message_in_transaction(msg, lambda m, a: UNKNOW)
        clients.heartbeat(producer)
        report = broker.advance(60)  # one 4.9.8 check interval: the first pass discards it
        assert report.check_backs == 0
    (copy,) = pull(broker.broker_addr, CHECK_MAX_TIME_TOPIC)
    assert copy.properties["KEYS"] == "OLD"
    assert copy.properties["TRANSACTION_CHECK_TIMES"] == "1"
    (half,) = pull(broker.broker_addr, HALF_TOPIC)
    assert "TRANSACTION_CHECK_TIMES" not in half.properties
