"""Name server: route queries as librocketmq parses them, auto-create on/off, unknown codes.

Routes of topics that do not exist yet follow Apache RocketMQ 4.9.8 (``DefaultRequestProcessor
.getRouteInfoByTopic``, ``AbstractSendMessageProcessor.msgCheck``, ``TopicConfigManager
.createTopicInSendMessageMethod``, ``ClientManageProcessor.heartBeat``): a route query creates
nothing; the producer falls back to TBW102's route and its first send creates the topic.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import pytest
from rocketmq.client import Message
from rocketmq.exceptions import ProducerSendSyncFailed
from txmsg_broker import EmbeddedBroker, codec, fastjson
from txmsg_broker.app import READY_PATTERN
from txmsg_broker.rawclient import call
from txmsg_broker.testing import Clients, create_topic, read_log, unique, wait_until
from txmsg_broker.topics import RETRY_PREFIX


def route(addr: str, topic: str) -> codec.RemotingCommand:
    return call(addr, codec.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


def send_ext(group: str, topic: str, default_queue_nums: int = 4) -> dict[str, object]:
    """SEND_MESSAGE_V2 header as librocketmq fills it (defaultTopic TBW102, 4 default queues)."""
    return {
        "a": group,
        "b": topic,
        "c": "TBW102",
        "d": default_queue_nums,
        "e": 0,
        "f": 0,
        "g": "1",
        "h": 0,
        "i": "",
        "j": "0",
        "k": "0",
        "l": 16,
        "m": "0",
    }


def test_unknown_topic_has_no_route_until_the_first_send_creates_it(txmsg_broker):
    topic = unique("RouteT")
    before = route(txmsg_broker.namesrv_addr, topic)
    assert before.code == codec.TOPIC_NOT_EXIST
    assert before.remark == (
        f"No topic route info in name server for the topic: {topic}\n"
        "See http://rocketmq.apache.org/docs/faq/ for further details."
    )
    assert (
        route(txmsg_broker.namesrv_addr, topic).code == codec.TOPIC_NOT_EXIST
    )  # asking creates nothing
    sent = call(txmsg_broker.broker_addr, codec.SEND_MESSAGE_V2, send_ext("PG", topic), b"x")
    assert sent.code == codec.SUCCESS
    after = route(
        txmsg_broker.namesrv_addr, topic
    )  # registered at once, as 4.9.8's registerBrokerAll
    assert after.code == codec.SUCCESS
    assert after.is_response
    data = fastjson.loads(after.body)
    (queue,) = data["queueDatas"]
    assert queue["writeQueueNums"] == 4
    assert queue["readQueueNums"] == 4
    assert queue["perm"] == 6  # TBW102's permission without INHERIT
    (broker,) = data["brokerDatas"]
    assert broker["brokerName"] == queue["brokerName"]
    assert broker["brokerAddrs"] == {"0": txmsg_broker.broker_addr}
    log = read_log(txmsg_broker.log_dir, "broker.log")
    assert f"the topic {topic} not exist, producer: /" in log
    assert (
        f"Create new topic by default topic:[TBW102] config:[TopicConfig [topicName={topic}, "
        in log
    )


def test_the_default_topic_is_what_producers_fall_back_to(txmsg_broker):
    """TBW102: 8 queues, perm RWX (inherit); a created topic gets min(client's default, 8) queues."""
    (queue,) = fastjson.loads(route(txmsg_broker.namesrv_addr, "TBW102").body)["queueDatas"]
    assert (queue["readQueueNums"], queue["writeQueueNums"], queue["perm"]) == (8, 8, 7)
    topic = unique("TwoQ")
    assert (
        call(txmsg_broker.broker_addr, codec.SEND_MESSAGE_V2, send_ext("PG", topic, 2), b"x").code
        == 0
    )
    (created,) = fastjson.loads(route(txmsg_broker.namesrv_addr, topic).body)["queueDatas"]
    assert (created["readQueueNums"], created["writeQueueNums"]) == (2, 2)


def test_a_consumer_of_a_topic_without_route_reaches_no_broker(txmsg_broker):
    """No route, so librocketmq knows no broker: its start-up heartbeat goes nowhere (it retries with
    its 30 s timer).  A consumer of an existing topic is registered at once."""
    missing, existing = unique("NoRouteT"), unique("RouteT")
    create_topic(txmsg_broker.namesrv_addr, existing)
    deaf, heard = unique("DeafCG"), unique("HeardCG")
    with Clients(txmsg_broker.namesrv_addr) as clients:
        clients.consumer(deaf, missing)
        clients.consumer(heard, existing)
        wait_until(
            lambda: (
                f"new consumer connected, group: {heard} "
                in read_log(txmsg_broker.log_dir, "broker.log")
            ),
            timeout=10,
        )
        log = read_log(txmsg_broker.log_dir, "broker.log")
        assert f"new consumer connected, group: {deaf} " not in log
        assert route(txmsg_broker.namesrv_addr, missing).code == codec.TOPIC_NOT_EXIST
        assert route(txmsg_broker.namesrv_addr, RETRY_PREFIX + deaf).code == codec.TOPIC_NOT_EXIST


def test_retry_topic_is_created_by_the_heartbeat_not_by_the_route_query(txmsg_broker):
    group = unique("CG")
    assert route(txmsg_broker.namesrv_addr, RETRY_PREFIX + group).code == codec.TOPIC_NOT_EXIST
    body = json.dumps(
        {
            "clientID": "127.0.0.1@1#R",
            "consumerDataSet": [
                {
                    "groupName": group,
                    "consumeType": 1,
                    "messageModel": 1,
                    "consumeFromWhere": 0,
                    "subscriptionDataSet": [],
                }
            ],
        }
    ).encode()
    assert call(txmsg_broker.broker_addr, codec.HEART_BEAT, {}, body).code == codec.SUCCESS
    response = route(txmsg_broker.namesrv_addr, RETRY_PREFIX + group)
    assert response.code == codec.SUCCESS
    (queue,) = fastjson.loads(response.body)["queueDatas"]
    assert queue["readQueueNums"] == 1


def test_no_auto_create_answers_topic_not_exist(txmsg_broker_factory):
    broker = txmsg_broker_factory(auto_create_topics=False)
    unknown = route(broker.namesrv_addr, unique("Nope"))
    assert unknown.code == codec.TOPIC_NOT_EXIST
    assert "No topic route info" in (unknown.remark or "")
    assert route(broker.namesrv_addr, "TBW102").code == codec.TOPIC_NOT_EXIST
    topic = unique("Nope")
    refused = call(broker.broker_addr, codec.SEND_MESSAGE_V2, send_ext("PG", topic), b"x")
    assert refused.code == codec.TOPIC_NOT_EXIST
    assert refused.remark == (
        f"topic[{topic}] not exist, apply first please!\nSee http://rocketmq.apache.org/docs/faq/ for further details."
    )
    log = read_log(broker.log_dir, "broker.log")
    assert "Create new topic failed, because the default topic[TBW102] has no perm [6]" in log
    assert (
        f"Create it with `txmsg topic create {topic}`" in log
    )  # what to do, in the rejection line


def test_no_auto_create_rejects_sends_to_unknown_topics(txmsg_broker_factory):
    broker = txmsg_broker_factory(auto_create_topics=False)
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.producer()
        msg = Message(unique("Nope"))
        msg.set_body(b"x")
        with pytest.raises(ProducerSendSyncFailed, match=r"(?i)route"):
            producer.send_sync(msg)


def test_invalid_topic_name_has_no_route(txmsg_broker):
    assert route(txmsg_broker.namesrv_addr, "bad topic!").code == codec.TOPIC_NOT_EXIST


def test_unknown_request_code_is_not_supported_on_both_ports(txmsg_broker):
    for addr in (txmsg_broker.namesrv_addr, txmsg_broker.broker_addr):
        response = call(addr, 9999, {"x": 1})
        assert response.code == codec.REQUEST_CODE_NOT_SUPPORTED
        assert "not supported" in (response.remark or "")


def test_cluster_info_lists_the_master(txmsg_broker):
    response = call(txmsg_broker.namesrv_addr, codec.GET_BROKER_CLUSTER_INFO)
    assert response.code == codec.SUCCESS
    table = fastjson.loads(response.body)["brokerAddrTable"]
    assert [b["brokerAddrs"]["0"] for b in table.values()] == [txmsg_broker.broker_addr]


def test_heartbeat_registers_groups_and_unregister_answers(txmsg_broker):
    body = json.dumps(
        {
            "clientID": "127.0.0.1@1#T",
            "producerDataSet": [{"groupName": "PG_HB"}],
            "consumerDataSet": [
                {
                    "groupName": "CG_HB",
                    "consumeType": 1,
                    "messageModel": 1,
                    "consumeFromWhere": 0,
                    "subscriptionDataSet": [{"topic": "T_HB", "subString": "*", "subVersion": "1"}],
                }
            ],
        }
    ).encode()
    assert call(txmsg_broker.broker_addr, codec.HEART_BEAT, {}, body).code == codec.SUCCESS
    # the heartbeat created the group's retry topic
    assert route(txmsg_broker.namesrv_addr, "%RETRY%CG_HB").code == codec.SUCCESS
    bad = call(txmsg_broker.broker_addr, codec.HEART_BEAT, {}, b"{not json")
    assert bad.code == codec.SYSTEM_ERROR
    unregister = call(
        txmsg_broker.broker_addr,
        codec.UNREGISTER_CLIENT,
        {"clientID": "x", "producerGroup": "PG_HB", "consumerGroup": ""},
    )
    assert unregister.code == codec.SUCCESS


def test_cli_runs_in_foreground_and_shuts_down_cleanly(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "txmsg_broker",
            "broker",
            "--namesrv-port",
            "0",
            "--broker-port",
            "0",
            "--data-dir",
            str(tmp_path / "d"),
            "--log-dir",
            str(tmp_path / "l"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        match = READY_PATTERN.search(first)
        assert match, first
        namesrv = f"{match.group(1)}:{match.group(2)}"
        assert (
            call(namesrv, codec.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}).code == codec.SUCCESS
        )
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=15)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "stopped" in rest
    assert "Shutdown hook over." in (tmp_path / "l" / "broker.log").read_text()


def test_embedded_broker_in_process_restart_keeps_ports_and_data(tmp_path):
    broker = EmbeddedBroker(tmp_path / "data", tmp_path / "logs").start()
    try:
        namesrv = broker.namesrv_addr
        ext = {
            "a": "PG",
            "b": "EmbT",
            "c": "TBW102",
            "d": 4,
            "e": 0,
            "f": 0,
            "g": "1",
            "h": 0,
            "i": "",
            "j": "0",
            "k": "0",
            "l": 16,
            "m": "0",
        }
        assert call(broker.broker_addr, codec.SEND_MESSAGE_V2, ext, b"one").code == codec.SUCCESS
        broker.restart()
        assert broker.namesrv_addr == namesrv
        second = call(broker.broker_addr, codec.SEND_MESSAGE_V2, ext, b"two")
        assert second.ext_fields["queueOffset"] == "1"  # the first message survived the restart
        assert broker.call(lambda b: [m.body for m in b.store.get("EmbT", 0, 0, 10)]) == [
            b"one",
            b"two",
        ]
    finally:
        broker.stop()
    assert not broker.running


def test_name_server_answers_in_fastjsons_non_strict_form_like_4_9_8(txmsg_broker: Any) -> None:
    """A real 4.9.8 name server leaves numeric map keys unquoted ({0:"host:port"}); a tool that
    parses its answers strictly fails on a real cluster, so it must fail here too."""
    create_topic(txmsg_broker.namesrv_addr, "FastjsonT")
    for answer in (
        route(txmsg_broker.namesrv_addr, "FastjsonT"),
        call(txmsg_broker.namesrv_addr, codec.GET_BROKER_CLUSTER_INFO),
    ):
        assert b'"brokerAddrs":{0:"' in answer.body
        with pytest.raises(ValueError, match="property name"):
            json.loads(answer.body)
        assert fastjson.loads(answer.body)
